"""`idled hook`: the daemon's presence events POSTed to a webhook, signed, in seq order, at least once
(docs/hook.md). Requests carry Standard Webhooks signatures (`idled.hook.sign`): receivers verify them with a stock library."""

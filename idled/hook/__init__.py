"""`idled hook`: the daemon's presence events POSTed to a webhook, signed, in seq order, at least once
(docs/hook.md). Receivers verify requests with `idled.hook.sign.verify_signature`."""

"""Attack the hook's redirect rule (idled.hook.post.redirect_target) with tricky Locations. Pure: no network.
Prints each Location, whether it is followed, and the hop; flags any followed hop whose real destination
(scheme, host, port as a socket would dial it) differs from --url's, and any exception other than the rule's."""
import httpx
from idled.hook.post import redirect_target

ORIGINS = ["https://hooks.example.com/in", "http://127.0.0.1:8080/in", "http://[::1]:8080/in", "http://example.com/in"]
LOCS = [
    "http://hooks.example.com/in", "https://hooks.example.com:443/x", "//evil.com/x", "/other", "other", "?q",
    "https://user:pw@hooks.example.com/x", "https://hooks.example.com@evil.com/x", "https://evil.com#@hooks.example.com",
    "https://hooks.example.com.evil.com/x", "https://HOOKS.EXAMPLE.COM/x", "https://hooks.example.com./x",
    "https://hooks.example.com:444/x", "https://hooks.example.com:0443/x", "https://hooks.example.com:99999/x",
    "https:hooks.example.com/x", "https:/evil.com/x", "https:\\\\evil.com/x", "\\\\evil.com/x", "/\\evil.com",
    "https://hooks.example.com\t.evil.com/", " https://evil.com/", "https://xn--hooks-example.com/",
    "http://127.0.0.1:8080/b", "http://127.1:8080/b", "http://2130706433:8080/b", "http://0x7f.0.0.1:8080/b",
    "http://[::1]:8080/b", "http://[0:0::1]:8080/b", "http://[::ffff:127.0.0.1]:8080/b", "http://localhost:8080/b",
    "http://example.com:80/x", "http://example.com/x", "https://example.com/x", "http://example.com:443/x",
    "http://exa%6dple.com/x", "http://example.com%2e/x", "http://ex\u0430mple.com/x", "javascript:alert(1)",
    "http://127.0.0.1:8080\r\nX: y", "http://[::1", "http://" + "a" * 300 + "/",
]
bad = 0
for o in ORIGINS:
    origin = httpx.URL(o)
    for loc in LOCS:
        for status in (307, 308):
            try:
                target, why = redirect_target(origin, origin, status, loc)
            except Exception as exc:  # noqa: BLE001
                print(f"EXCEPTION {o} {loc!r}: {type(exc).__name__}: {exc}")
                bad += 1
                continue
            if target is not None and status == 307:
                print(f"followed {o} <- {loc!r} -> {target} (host={target.host!r} port={target.port} raw_host={target.raw_host!r})")
print("exceptions:", bad)

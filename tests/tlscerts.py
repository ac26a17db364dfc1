"""Test certificates made with the `openssl` binary (no network): a private CA, server and client certificates.

`Certs(directory)` makes a CA once; `server()` a certificate for 127.0.0.1/localhost signed by it,
`self_signed()` one signed by nobody, `expired()` one whose validity ended yesterday, `client(name)` a client
certificate carrying the URI `idled:<name>` (e.g. `idled:gateway:gw1`) or, with `cn=True`, the subject CN
`<name>`. Tests that need them skip (with the reason) where `openssl` is missing.
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
from pathlib import Path

import pytest

OPENSSL = shutil.which("openssl")


def need_openssl() -> str:
    if OPENSSL is None:
        pytest.skip("the openssl binary is not installed (Debian: apt-get install openssl)")
    return OPENSSL


def _run(*args: str) -> None:
    subprocess.run([need_openssl(), *args], check=True, capture_output=True, timeout=60)


EC = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes")


class Certs:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.ca, self.ca_key = directory / "ca.pem", directory / "ca.key"
        _run("req", "-x509", *EC, "-keyout", str(self.ca_key), "-out", str(self.ca), "-days", "2",
             "-subj", "/CN=idled test CA")
        self._serial = 1

    def _signed(
        self, name: str, subject: str, ext: str, days: str = "2", start: str | None = None
    ) -> tuple[Path, Path]:
        cert, key, csr, extfile = (self.dir / f"{name}.pem", self.dir / f"{name}.key", self.dir / f"{name}.csr",
                                   self.dir / f"{name}.ext")
        extfile.write_text(ext + "\n")
        _run("req", "-new", *EC, "-keyout", str(key), "-out", str(csr), "-subj", subject)
        self._serial += 1
        if start is None:
            _run("x509", "-req", "-in", str(csr), "-CA", str(self.ca), "-CAkey", str(self.ca_key),
                 "-set_serial", str(self._serial), "-days", days, "-extfile", str(extfile), "-out", str(cert))
        else:  # a validity in the past: `openssl ca` is the one tool that takes explicit dates
            conf = self.dir / f"{name}.cnf"
            (self.dir / "index.txt").write_text("")
            conf.write_text(
                "[ca]\ndefault_ca=d\n[d]\n"
                f"database={self.dir / 'index.txt'}\nnew_certs_dir={self.dir}\nserial={self.dir / 'serial'}\n"
                "default_md=sha256\npolicy=p\ncopy_extensions=copy\nunique_subject=no\n[p]\ncommonName=supplied\n")
            (self.dir / "serial").write_text(f"{self._serial:04X}\n")
            _run("ca", "-batch", "-config", str(conf), "-cert", str(self.ca), "-keyfile", str(self.ca_key),
                 "-in", str(csr), "-out", str(cert), "-startdate", start, "-enddate", days,
                 "-extfile", str(extfile), "-notext")
        return cert, key

    def server(self, name: str = "server") -> tuple[Path, Path]:
        return self._signed(name, "/CN=localhost", "subjectAltName=IP:127.0.0.1,DNS:localhost")

    def expired(self) -> tuple[Path, Path]:
        return self._signed("expired", "/CN=localhost", "subjectAltName=IP:127.0.0.1,DNS:localhost",
                            days="20200102000000Z", start="20200101000000Z")

    def self_signed(self) -> tuple[Path, Path]:
        cert, key = self.dir / "self.pem", self.dir / "self.key"
        _run("req", "-x509", *EC, "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=localhost",
             "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost")
        return cert, key

    def client(self, name: str, *, cn: bool = False) -> tuple[Path, Path]:
        file = name.replace(":", "_")
        if cn:
            return self._signed(f"client-{file}", f"/CN={name}", "basicConstraints=CA:FALSE")
        return self._signed(f"client-{file}", "/CN=some-host", f"subjectAltName=URI:idled:{name}")

    def client_context(self, cert: tuple[Path, Path] | None = None) -> ssl.SSLContext:
        """A verifying client context trusting the CA (with a client certificate if given), ALPN idled/1."""
        ctx = ssl.create_default_context(cafile=str(self.ca))
        ctx.set_alpn_protocols(["idled/1"])
        if cert is not None:
            ctx.load_cert_chain(str(cert[0]), str(cert[1]))
        return ctx

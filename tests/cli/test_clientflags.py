"""What the client commands say when there is no daemon, or a flag is out of range: one line that names the
address, the operating system's reason once, and what to do (start `idled serve`); a port flag names itself
and its value. In-process `main(argv)` against a real loopback port with nothing listening."""

from __future__ import annotations

import socket

import pytest

from idled.cli import main as cli


def dead_port() -> int:
    """A loopback port nothing listens on (bound, then closed: free again, refused until someone binds)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("argv", [["user", "bob"], ["query", "alice"], ["watch"]], ids=lambda a: a[0])
def test_no_daemon_is_one_line_naming_the_reason_once_and_idled_serve(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    port = dead_port()
    assert cli.main([*argv, "--port", str(port)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"127.0.0.1:{port}" in err and err.count(str(port)) == 1, err
    assert err.count("Connection refused") == 1 and "all attempts" not in err, err
    assert "start it with: idled serve" in err


def test_status_without_a_daemon_suggests_idled_serve(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["status", "--metrics", f"127.0.0.1:{dead_port()}", "--timeout", "2"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Connection refused" in err and "start it with: idled serve" in err, err


def test_an_unknown_host_is_not_blamed_on_a_stopped_daemon(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["query", "alice", "--host", "no-such-host.invalid", "--connect-timeout", "5"]) == 1
    err = capsys.readouterr().err
    assert "no-such-host.invalid" in err and "idled serve" not in err, err


@pytest.mark.parametrize("command", [["user", "bob"], ["query", "alice"], ["watch"]], ids=lambda a: a[0])
def test_an_out_of_range_port_names_the_flag_and_the_value(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main([*command, "--port", "99999"])
    assert exit_info.value.code == 2
    assert "argument --port: port must be 0..65535, got 99999" in capsys.readouterr().err

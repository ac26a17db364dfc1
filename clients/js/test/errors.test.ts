// The retryable/final classification of idled/client/errors.py, code by code.
import { test } from "node:test";
import assert from "node:assert/strict";
import { errorFrom, IdledError, connectionLost } from "../src/protocol/errors.js";

test("retryable codes are those of the Python client; everything else is final", () => {
  for (const code of ["busy", "server_shutdown", "idle_timeout", "login_timeout", "not_leader", "unavailable"]) {
    assert.equal(errorFrom(code, "x").retryable, true, code);
  }
  assert.equal(connectionLost("reset").retryable, true);
  for (const code of ["auth_failed", "kicked", "tls_required", "bad_frame", "bad_message", "not_allowed", "gone",
    "too_large", "not_logged_in", "some_future_code"]) {
    const error = errorFrom(code, "x");
    assert.equal(error.retryable, false, code);
    assert.equal(error.final, true, code);
  }
});

test("the leader hint is kept with not_leader only, and gone says the oldest seq", () => {
  assert.equal(errorFrom("not_leader", "standby", "b:7878").leader, "b:7878");
  assert.equal(errorFrom("busy", "x", "b:7878").leader, undefined);
  assert.equal(errorFrom("gone", "from 3 is older than the log: the oldest available is 17").oldestSeq, 17);
  assert.ok(errorFrom("kicked", "newer login") instanceof IdledError);
  assert.equal(String(errorFrom("kicked", "newer login").message), "kicked: newer login");
});

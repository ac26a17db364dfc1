/**
 * The protocol's error codes and the client's one error type.
 *
 * Every failure the client reports is an `IdledError`. `code` is the server's error code (from an `error`
 * frame) or a client-side one (`connection_lost`). `retryable` says whether reconnecting can help, exactly as
 * idled/client/errors.py classifies it: a server at capacity, restarting or unable to take new work for now
 * (`busy`, `server_shutdown`, `unavailable`), our own lost keepalives (`idle_timeout`, `login_timeout`), a
 * dropped connection and `not_leader` (another core, or this one once promoted, takes the login) are worth a
 * retry with backoff; anything else -- `auth_failed`, `kicked`, `tls_required`, a malformed message, and every
 * code this client does not know -- fails the same way again: final.
 */

export const ErrorCode = {
  BAD_FRAME: "bad_frame",
  TOO_LARGE: "too_large",
  BAD_MESSAGE: "bad_message",
  AUTH_FAILED: "auth_failed",
  LOGIN_TIMEOUT: "login_timeout",
  NOT_LOGGED_IN: "not_logged_in",
  NOT_ALLOWED: "not_allowed",
  IDLE_TIMEOUT: "idle_timeout",
  KICKED: "kicked",
  BUSY: "busy",
  SERVER_SHUTDOWN: "server_shutdown",
  GONE: "gone",
  NOT_LEADER: "not_leader",
  TLS_REQUIRED: "tls_required",
  UNAVAILABLE: "unavailable",
} as const;

export type ServerErrorCode = (typeof ErrorCode)[keyof typeof ErrorCode];

/** The client-side code: the connection failed or closed without an error frame. */
export const CONNECTION_LOST = "connection_lost";

export type ErrorCodeName = ServerErrorCode | typeof CONNECTION_LOST | (string & {});

/** Codes after which the same login may succeed later (idled/client/errors.py RETRYABLE_CODES). */
export const RETRYABLE_CODES: ReadonlySet<string> = new Set<string>([
  ErrorCode.BUSY, ErrorCode.SERVER_SHUTDOWN, ErrorCode.IDLE_TIMEOUT, ErrorCode.LOGIN_TIMEOUT, CONNECTION_LOST,
  ErrorCode.NOT_LEADER, ErrorCode.UNAVAILABLE,
]);

export class IdledError extends Error {
  readonly code: ErrorCodeName;
  readonly reason: string;
  /** `not_leader` only: the core the refusal named ("HOST:PORT"), when the refusing core knew it. */
  readonly leader: string | undefined;
  /** `connection_lost` only: true when the connect itself was refused (nothing listens there). */
  readonly refused: boolean;

  constructor(code: ErrorCodeName, reason: string, options: { leader?: string; refused?: boolean } = {}) {
    super(`${code}: ${reason}`);
    this.name = "IdledError";
    this.code = code;
    this.reason = reason;
    this.leader = options.leader;
    this.refused = options.refused ?? false;
  }

  /** True when reconnecting (after a backoff) may succeed. */
  get retryable(): boolean {
    return RETRYABLE_CODES.has(this.code);
  }

  /** True when the same attempt will fail the same way again (the negation of `retryable`). */
  get final(): boolean {
    return !this.retryable;
  }

  /** `gone` only: the oldest seq the server still has, when its reason says so (resume from there). */
  get oldestSeq(): number | undefined {
    if (this.code !== ErrorCode.GONE) return undefined;
    const match = /oldest available is (\d+)/.exec(this.reason);
    return match ? Number(match[1]) : undefined;
  }
}

/** The error for an `error` frame (the `leader` hint is kept only with `not_leader`, as the protocol says). */
export function errorFrom(code: string, reason: string, leader?: string): IdledError {
  return new IdledError(code, reason, code === ErrorCode.NOT_LEADER && leader !== undefined ? { leader } : {});
}

export function connectionLost(reason: string, refused = false): IdledError {
  return new IdledError(CONNECTION_LOST, reason, { refused });
}

/**
 * Finding the leader among several cores: which core to try next (sans-IO; idled/client/leader.py).
 *
 * Theory of operation
 * -------------------
 * Attempts come in rounds. A round tries each listed core at most once, in list order from where it started
 * (wrapping). A failure with another core left in the round is retried at once; the link sleeps its backoff
 * only when a round is over, so a dead member costs one refused connect, not a backoff.
 *
 * A refusal's `leader` hint is tried next, unless it was tried in this round already (two stale cores naming
 * each other must not ping-pong). A hint outside the list is followed too (the leader moved to a core the list
 * does not know), at most `members.length` times per round.
 *
 * A round starts with the hint of the last failure, else the core last logged in to (after a plain restart it
 * is the likeliest one), else the first listed. `connected()` records the leader; `lost(hint)` is a connection
 * that was up and ended: a new round begins at the hint, or at that same core.
 *
 * By hand, cores [S, A] (S a standby of A): start at S; failed("A") -> A, true (at once); connected(): leader
 * A; lost() -> A; failed() -> S, true; failed("A") -> A tried this round: the round is over, target A, false
 * (back off); failed() -> S, true; connected(): S was promoted.
 */

export class LeaderSearch {
  readonly members: readonly string[];
  target: string;
  leader: string | null = null;
  private tried = new Set<string>();
  private extra = 0;

  constructor(members: readonly string[]) {
    if (members.length === 0) throw new RangeError("at least one core is needed");
    this.members = [...new Set(members)];
    this.target = this.members[0]!;
  }

  /** The attempt at `target` failed (`hint`: the leader its refusal named). True: try the new `target` at
   * once; false: the round is over, back off before trying the new `target`. */
  failed(hint: string | null = null): boolean {
    this.tried.add(this.target);
    if (hint !== null && !this.tried.has(hint)) {
      const listed = this.members.includes(hint);
      if (listed || this.extra < this.members.length) {
        if (!listed) this.extra += 1;
        this.target = hint;
        return true;
      }
    }
    const members = this.members;
    const at = members.indexOf(this.target);
    const start = at >= 0 ? at + 1 : 0;
    for (let offset = 0; offset < members.length; offset++) {
      const member = members[(start + offset) % members.length]!;
      if (!this.tried.has(member)) {
        this.target = member;
        return true;
      }
    }
    this.newRound(hint);
    return false;
  }

  /** Logged in at `target`: it is the leader. */
  connected(): void {
    this.leader = this.target;
    this.tried.clear();
    this.extra = 0;
  }

  /** The connection to the leader ended (`hint`: the leader it named, if it refused on the way out). */
  lost(hint: string | null = null): void {
    this.newRound(hint);
  }

  private newRound(hint: string | null): void {
    this.tried.clear();
    this.extra = 0;
    this.target = hint ?? this.leader ?? this.members[0]!;
  }
}

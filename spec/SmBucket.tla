------------------------------ MODULE SmBucket ------------------------------
(***************************************************************************)
(* The SM limit's shared token bucket of one device and its controller    *)
(* lease: core/src/bucket.rs (refill, consume, set_rate, take_lease,      *)
(* lease_runs) and the loop that calls them, ffi/src/sm_limit.rs          *)
(* (before_launch -> consume; controller_loop -> take_lease, set_rate).   *)
(*                                                                        *)
(* The bucket (layout::SmBucket) is five 64-bit atomics in the region,    *)
(* used without a lock: `tokens` (signed; negative = debt), `rate`        *)
(* (tokens per tick; 0 = unmetered), `refilled` (refilled_ns: time of the *)
(* last refill), `spent` (tokens ever taken) and `lease` (holder pid,     *)
(* expiry in ms mod 2^32).  Each atomic load, CAS, swap, store and        *)
(* fetch_add/sub is one step (sequentially consistent: the orderings are  *)
(* not modelled).  Time is `t`, in ticks, advanced by Tick up to MaxTime; *)
(* a process reads it (platform.now_ns) in a step of its own, so its      *)
(* reading can be stale by any number of ticks when it uses it.           *)
(*                                                                        *)
(* Two parts, which share only the clock, so each config runs one of them *)
(* (the other one's set is empty):                                        *)
(*                                                                        *)
(* 1. Launchers (a thread of any process that launches kernels) run       *)
(*    consume(Cost), Rounds times.  pc values in brackets:                *)
(*    consume: [l_idle] start = now_ns(); refill(start), whose [r_clk]   *)
(*      is taken in the same step; [c_spent] spent += cost (fetch_add);   *)
(*      [c_sub] after = tokens.fetch_sub(cost)                            *)
(*      - cost; after >= 0 -> return.  Wait loop: [w_rate] rate.load; 0 -> *)
(*      return; [w_debt] tokens.load; >= 0 -> return; else return (the    *)
(*      bounded wait, MAX_WAIT_NS, elapsed: a free choice here) or sleep  *)
(*      and refill(now_ns()) again, at most WaitRounds times.             *)
(*    refill(now): [r_clk] the caller's now_ns() and `rate = rate.load`  *)
(*      in one step (the clock read conflicts only with Tick, the load    *)
(*      only with set_rate's swap, and those two commute); [r_last]       *)
(*      `last = refilled_ns.load`; now <= last -> return; [r_cas]         *)
(*      refilled_ns.compare_exchange(last, now), failure -> return; rate  *)
(*      = 0 -> return; earned = rate * (now - last); [r_tload] `cur =     *)
(*      tokens(b)`; [r_tcas] tokens.compare_exchange_weak(cur, next) with *)
(*      next = min(cur + earned, max(cap, cur)), cap = rate * Burst       *)
(*      (tokens_in(rate, BURST_NS)), or next = min(cur + earned, 0) where *)
(*      now - last > Idle (IDLE_NS without launches: the program starts   *)
(*      again without credit); failure -> cur = the value found,          *)
(*      again.  (A spurious failure of the weak CAS is one more round of  *)
(*      the loop with the same value: not modelled.)                      *)
(*    The Setter is the controller's set_rate(rate, forgive) calls, in    *)
(*    the order RateSteps gives: [s_swap] old = rate.swap(rate); old = 0, *)
(*    rate # 0 and forgive -> [s_forgive] tokens.store(0).  Which process *)
(*    calls set_rate does not matter to the bucket (part 2 elects it).    *)
(*                                                                        *)
(* 2. Controllers (the controller thread of each process, Ctrls = pids)   *)
(*    loop on take_lease(me, now_ms) for ever:                            *)
(*    LeaseClock = "after_load" is the code (take_lease takes a clock and *)
(*      reads it after the load): [c_load] cur = lease.load; [c_clk] read *)
(*      the clock: holder != me, holder != 0 and lease_runs(expiry, now)  *)
(*      -> false; [c_cas] lease.compare_exchange(cur, (me, now + LEASE_MS *)
(*      mod 2^32)).                                                       *)
(*    LeaseClock = "before_load" is the bug of commit d7f0ecb, fixed in   *)
(*      ff0a787: controller_loop read `now` once per period and passed    *)
(*      it in, so the clock was read before the load ([c_clk], [c_load],  *)
(*      [c_cas]); SmBucketLease_wit_clock_before_load fails Exclusivity.  *)
(*    lease_runs(e, now) = let ahead = (e - now) mod Wrap in ahead # 0 /\ *)
(*      ahead <= Lease.  Wrap stands for 2^32 ms and Lease for LEASE_MS;  *)
(*      the clock's value in ms is (start + t) mod Wrap, with `start` any *)
(*      of Starts (the uptime when the model begins), so the wrap is      *)
(*      reachable.  A false result makes the process drop its controller *)
(*      (controllers[dev] = None): its term ends.                         *)
(*                                                                        *)
(* A crash (SIGKILL) stops a process; everything in the region stays as  *)
(* it was.  Part 2 has a crash step for every live controller (the lease  *)
(* of a dead holder must be taken over).  Part 1 checks only invariants,  *)
(* and a killed launcher is a launcher that takes no more steps, which    *)
(* the interleavings already contain (its ghosts stay counted), so it has *)
(* no crash step: one would only double the states.  A refill that won    *)
(* the refilled_ns CAS and dies before its tokens CAS loses that          *)
(* interval's tokens (`owed` below keeps them visible); one that dies     *)
(* between spent += cost and the fetch_sub leaves the cost in `spent`     *)
(* only (`dbt`).                                                          *)
(*                                                                        *)
(* Ghosts: cred[i] = how many refills claimed tick i (the interval        *)
(* (i-1, i]) by moving refilled_ns across it; credited = the tokens those *)
(* claims earned; L[l].owed = earned by l's claim and not yet added;      *)
(* L[l].dbt = the cost l added to `spent` and not yet subtracted;         *)
(* discarded = what the cap cut off; forgiven = what set_rate's store     *)
(* changed; C[c].term = the absolute tick at which the term granted by c's *)
(* last successful take_lease ends (-1: none).                            *)
(*                                                                        *)
(* Bugs: "refill_store" refilled_ns by load then store, no CAS;           *)
(* "tokens_store" tokens by a plain store of next, no CAS; "old_rule" the *)
(* lease rule before d7f0ecb, "expired iff (now - expiry) mod Wrap <      *)
(* Wrap/2", no holder-0 case; "lease_store" the lease by a plain store.   *)
(*                                                                        *)
(* Found by TLC (and by model/tests/shuttle_bucket.rs): with the clock    *)
(* read before the load, a controller whose `now` is one tick stale sees  *)
(* a lease that another process took or renewed since as expiring more    *)
(* than Lease ahead, judges it stale and takes it: two controllers whose  *)
(* terms both run (SmBucketLease_wit_clock_before_load fails              *)
(* Exclusivity). TLC: 1 reads now = 0; tick; 2 reads now = 1, loads (0,   *)
(* 0), CASes (2, 3); 1 loads (2, 3): ahead = 3 > Lease, "stale"; 1 CASes  *)
(* (1, 2). At t = 1 both terms run (to 3 and to 2). With the clock read   *)
(* after the load (the code, and SmBucketLease), every lease a process    *)
(* loads was written at a time no later than its own reading, so ahead <= *)
(* Lease holds for a term that runs.                                      *)
(*                                                                        *)
(* Liveness (LeaseTaken) is checked with the clock free to stop: time    *)
(* stops at MaxTime, or earlier if Tick is never taken again, and the     *)
(* controllers keep calling take_lease at that time.  A dead holder's     *)
(* lease that still runs when time stops counts as controlled.           *)
(* refilled_ns is u64 nanoseconds and never wraps: part 1 uses t as is.   *)
(***************************************************************************)
EXTENDS Integers, FiniteSets, Sequences, TLC

CONSTANTS
    Launchers,   \* launching threads (numbers); {} leaves part 1 out
    Rounds,      \* consume calls per launcher
    Cost,        \* blocks of a launch (> 0)
    WaitRounds,  \* refills of one consume's wait loop, at most
    T0,          \* tokens at the start
    Rate0,       \* rate at the start
    Burst,       \* BURST_NS in ticks: cap = rate * Burst
    Idle,        \* IDLE_NS in ticks: a longer gap since the last refill earns no credit
    RateSteps,   \* the Setter's set_rate calls: << [r |-> rate, f |-> forgive], ... >>
    Ctrls,       \* controller processes = their pids (numbers > 0); {} leaves part 2 out
    Wrap,        \* the ms clock's modulus (2^32 in the code)
    Lease,       \* LEASE_MS in ticks (0 < Lease < Wrap)
    Starts,      \* possible ms clock values at t = 0
    LeaseClock,  \* "after_load" (the code) | "before_load" (the bug of d7f0ecb)
    MaxTime,     \* Tick stops here
    Bug          \* "none" or a planted bug

ASSUME Bug \in {"none", "refill_store", "tokens_store", "old_rule", "lease_store"}
ASSUME LeaseClock \in {"before_load", "after_load"}
ASSUME Cost > 0 /\ 0 < Lease /\ Lease < Wrap /\ Starts \subseteq 0..(Wrap - 1)
ASSUME \A c \in Ctrls : c \in Nat \ {0}

VARIABLES
    t,           \* the clock, absolute ticks
    tokens, rate, refilled, spent,  \* the bucket
    L,           \* L[l]: launcher l's pc and locals (and its ghosts owed, dbt)
    spc, sidx,   \* the Setter: pc and the next entry of RateSteps
    cred, credited, discarded, forgiven,  \* ghosts of the bucket
    lease,       \* the lease word: [h |-> holder pid, e |-> expiry mod Wrap]
    start,       \* the ms clock at t = 0 (fixed)
    C,           \* C[c]: controller c's pc, clock reading, loaded word, term
    wrongRefusal \* ghost: some take_lease refused a free or stale lease

vars == <<t, tokens, rate, refilled, spent, L, spc, sidx, cred, credited, discarded,
          forgiven, lease, start, C, wrongRefusal>>
bucket   == <<tokens, rate, refilled, spent>>
setter   == <<spc, sidx>>
ghosts   == <<cred, credited, discarded, forgiven>>
leasePart == <<lease, start, C, wrongRefusal>>

Min(a, b) == IF a < b THEN a ELSE b
Max(a, b) == IF a > b THEN a ELSE b
\* Schedules for RateSteps (a cfg file cannot spell a sequence of records):
\* none; and start metering with the debt forgiven, back to unmetered (a
\* re-measurement), metering again keeping the debt.
NoSteps == << >>
MeterSteps == << [r |-> 1, f |-> TRUE], [r |-> 0, f |-> FALSE], [r |-> 1, f |-> FALSE] >>

SumOf(f) == LET S[T \in SUBSET Launchers] ==
                  IF T = {} THEN 0 ELSE LET x == CHOOSE y \in T : TRUE IN L[x][f] + S[T \ {x}]
            IN S[Launchers]

-----------------------------------------------------------------------------
(* Part 1: the bucket                                                     *)

LIdle == [pc |-> "l_idle", now |-> 0, rt |-> 0, last |-> 0, cur |-> 0, ret |-> "l_idle",
          waits |-> 0, round |-> 0, owed |-> 0, dbt |-> 0]

\* Launcher l's new record, s; everything outside the bucket and L unchanged.
SetL(l, s) == L' = [L EXCEPT ![l] = s]
\* refill returns to the caller: its locals are dropped.
Return(s) == [s EXCEPT !.pc = s.ret, !.now = 0, !.rt = 0, !.last = 0, !.cur = 0]

\* consume: start = now_ns(); refill(b, start), whose first step (the rate
\* load, as in RClk) is taken with it: the call itself touches nothing shared.
LStart(l) == LET s == L[l] IN
    /\ s.pc = "l_idle" /\ s.round < Rounds
    /\ SetL(l, [s EXCEPT !.pc = "r_last", !.ret = "c_spent", !.round = s.round + 1,
                         !.waits = 0, !.now = t, !.rt = rate])
    /\ UNCHANGED <<t, bucket, setter, ghosts, leasePart>>

\* refill: (the caller's now_ns) let rate = b.rate.load(..)
RClk(l) == LET s == L[l] IN
    /\ s.pc = "r_clk"
    /\ SetL(l, [s EXCEPT !.pc = "r_last", !.now = t, !.rt = rate])
    /\ UNCHANGED <<t, bucket, setter, ghosts, leasePart>>

\* let last = b.refilled_ns.load(..); if now_ns <= last { return }
RLast(l) == LET s == L[l] IN
    /\ s.pc = "r_last"
    /\ IF s.now <= refilled
          THEN SetL(l, Return(s))
          ELSE SetL(l, [s EXCEPT !.pc = "r_cas", !.last = refilled])
    /\ UNCHANGED <<t, bucket, setter, ghosts, leasePart>>

\* b.refilled_ns.compare_exchange(last, now_ns): Err -> return; rate == 0 ->
\* return; earned = tokens_in(rate, now_ns - last).  (refill_store: the
\* store always happens.)
RCas(l) == LET s == L[l]
               earned == s.rt * (s.now - s.last) IN
    /\ s.pc = "r_cas"
    /\ IF refilled = s.last \/ Bug = "refill_store"
          THEN /\ refilled' = s.now
               /\ cred' = [i \in DOMAIN cred |->
                             IF s.last < i /\ i <= s.now THEN cred[i] + 1 ELSE cred[i]]
               /\ credited' = credited + earned
               /\ IF s.rt = 0
                     THEN SetL(l, Return(s))
                     ELSE SetL(l, [s EXCEPT !.pc = "r_tload", !.owed = earned])
          ELSE /\ SetL(l, Return(s))
               /\ UNCHANGED <<refilled, cred, credited>>
    /\ UNCHANGED <<t, tokens, rate, spent, setter, discarded, forgiven, leasePart>>

\* let mut cur = tokens(b)
RTLoad(l) == LET s == L[l] IN
    /\ s.pc = "r_tload"
    /\ SetL(l, [s EXCEPT !.pc = "r_tcas", !.cur = tokens])
    /\ UNCHANGED <<t, bucket, setter, ghosts, leasePart>>

\* next = refilled(cur, rate, now_ns - last): cur.saturating_add(earned).min(cap),
\* cap = 0 after an idle gap, else cap.max(cur);
\* b.tokens.compare_exchange_weak(cur, next): Ok -> return; Err(now) -> cur = now.
\* (tokens_store: b.tokens.store(next), whatever tokens holds now.)
RTCas(l) == LET s == L[l]
                next == IF s.now - s.last > Idle
                           THEN Min(s.cur + s.owed, 0)
                           ELSE Min(s.cur + s.owed, Max(s.rt * Burst, s.cur)) IN
    /\ s.pc = "r_tcas"
    /\ IF tokens = s.cur \/ Bug = "tokens_store"
          THEN /\ tokens' = next
               /\ discarded' = discarded + (s.cur + s.owed - next)
               /\ SetL(l, Return([s EXCEPT !.owed = 0]))
          ELSE /\ SetL(l, [s EXCEPT !.cur = tokens])
               /\ UNCHANGED <<tokens, discarded>>
    /\ UNCHANGED <<t, rate, refilled, spent, setter, cred, credited, forgiven, leasePart>>

\* b.spent.fetch_add(cost)
CSpent(l) == LET s == L[l] IN
    /\ s.pc = "c_spent"
    /\ spent' = spent + Cost
    /\ SetL(l, [s EXCEPT !.pc = "c_sub", !.dbt = Cost])
    /\ UNCHANGED <<t, tokens, rate, refilled, setter, ghosts, leasePart>>

\* let after = b.tokens.fetch_sub(cost) - cost; if after >= 0 { return 0 }
CSub(l) == LET s == L[l] IN
    /\ s.pc = "c_sub"
    /\ tokens' = tokens - Cost
    /\ SetL(l, [s EXCEPT !.pc = IF tokens - Cost >= 0 THEN "l_idle" ELSE "w_rate",
                         !.dbt = 0])
    /\ UNCHANGED <<t, rate, refilled, spent, setter, ghosts, leasePart>>

\* loop { let rate = b.rate.load(..); ... if rate == 0 ... { return } }
WRate(l) == LET s == L[l] IN
    /\ s.pc = "w_rate"
    /\ SetL(l, [s EXCEPT !.pc = IF rate = 0 THEN "l_idle" ELSE "w_debt"])
    /\ UNCHANGED <<t, bucket, setter, ghosts, leasePart>>

\* let debt = tokens(b); debt >= 0 or waited >= MAX_WAIT_NS -> return;
\* else sleep, refill(b, now_ns()).
WDebt(l) == LET s == L[l] IN
    /\ s.pc = "w_debt"
    /\ IF tokens >= 0
          THEN SetL(l, [s EXCEPT !.pc = "l_idle"])
          ELSE \/ SetL(l, [s EXCEPT !.pc = "l_idle"])
               \/ /\ s.waits < WaitRounds
                  /\ SetL(l, [s EXCEPT !.pc = "r_clk", !.ret = "w_rate", !.waits = s.waits + 1])
    /\ UNCHANGED <<t, bucket, setter, ghosts, leasePart>>

LStep(l) == LStart(l) \/ RClk(l) \/ RLast(l) \/ RCas(l) \/ RTLoad(l) \/ RTCas(l)
            \/ CSpent(l) \/ CSub(l) \/ WRate(l) \/ WDebt(l)

\* set_rate: let starts = b.rate.swap(rate) == 0 && rate != 0;
\*           if starts && forgive_debt { b.tokens.store(0) }
SSwap ==
    /\ spc = "s_swap" /\ sidx <= Len(RateSteps)
    /\ rate' = RateSteps[sidx].r
    /\ IF rate = 0 /\ RateSteps[sidx].r # 0 /\ RateSteps[sidx].f
          THEN spc' = "s_forgive" /\ UNCHANGED sidx
          ELSE sidx' = sidx + 1 /\ UNCHANGED spc
    /\ UNCHANGED <<t, tokens, refilled, spent, L, ghosts, leasePart>>
SForgive ==
    /\ spc = "s_forgive"
    /\ tokens' = 0
    /\ forgiven' = forgiven - tokens
    /\ spc' = "s_swap" /\ sidx' = sidx + 1
    /\ UNCHANGED <<t, rate, refilled, spent, L, cred, credited, discarded, leasePart>>
SStep == SSwap \/ SForgive

-----------------------------------------------------------------------------
(* Part 2: the controller lease                                           *)

NoWord == [h |-> 0, e |-> 0]     \* also a fresh bucket's lease
MsAt(a) == (start + a) % Wrap     \* now_ms as u32 at absolute tick a

\* lease_runs(expiry, now_ms)
LeaseRuns(e, n) == LET ahead == (e - n) % Wrap IN ahead # 0 /\ ahead <= Lease
\* The rule before d7f0ecb: (now_ms as u32).wrapping_sub(expiry) as i32 >= 0.
OldExpired(e, n) == (n - e) % Wrap < Wrap \div 2

\* take_lease's early `return false` for process c, word w, now_ms n.
Refuses(c, w, n) ==
    IF Bug = "old_rule" THEN w.h # c /\ ~OldExpired(w.e, n)
                        ELSE w.h # c /\ w.h # 0 /\ LeaseRuns(w.e, n)

FirstPc == IF LeaseClock = "before_load" THEN "c_clk" ELSE "c_load"
CIdle == [pc |-> FirstPc, abs |-> 0, cur |-> NoWord, term |-> -1]

\* The check: word w loaded, clock read at absolute tick a.  A refusal ends
\* c's term (controllers[dev] = None); it is wrong if w is free, c's own or
\* not running by lease_runs.
Decide(c, w, a) ==
    LET n == MsAt(a) IN
    IF Refuses(c, w, n)
       THEN /\ C' = [C EXCEPT ![c] = CIdle]
            /\ wrongRefusal' = (wrongRefusal \/ w.h = 0 \/ w.h = c \/ ~LeaseRuns(w.e, n))
       ELSE /\ C' = [C EXCEPT ![c] = [C[c] EXCEPT !.pc = "c_cas", !.abs = a, !.cur = w]]
            /\ UNCHANGED wrongRefusal

\* before_load: controller_loop's `let now = rt.platform.now_ns()`.
\* after_load:  the clock read after the load, then the check.
CClk(c) ==
    /\ C[c].pc = "c_clk"
    /\ IF LeaseClock = "before_load"
          THEN C' = [C EXCEPT ![c].pc = "c_load", ![c].abs = t] /\ UNCHANGED wrongRefusal
          ELSE Decide(c, C[c].cur, t)
    /\ UNCHANGED <<t, bucket, L, setter, ghosts, lease, start>>

\* let cur = b.lease.load(..); (before_load: the check, on the caller's now)
CLoad(c) ==
    /\ C[c].pc = "c_load"
    /\ IF LeaseClock = "before_load"
          THEN Decide(c, lease, C[c].abs)
          ELSE C' = [C EXCEPT ![c].pc = "c_clk", ![c].cur = lease] /\ UNCHANGED wrongRefusal
    /\ UNCHANGED <<t, bucket, L, setter, ghosts, lease, start>>

\* b.lease.compare_exchange(cur, (me << 32) | (now_ms + LEASE_MS) as u32).is_ok()
\* (lease_store: b.lease.store(next); true.)
CCas(c) ==
    /\ C[c].pc = "c_cas"
    /\ IF lease = C[c].cur \/ Bug = "lease_store"
          THEN /\ lease' = [h |-> c, e |-> MsAt(C[c].abs + Lease)]
               /\ C' = [C EXCEPT ![c] = [CIdle EXCEPT !.term = C[c].abs + Lease]]
          ELSE /\ C' = [C EXCEPT ![c] = CIdle]
               /\ UNCHANGED lease
    /\ UNCHANGED <<t, bucket, L, setter, ghosts, start, wrongRefusal>>

CStep(c) == CClk(c) \/ CLoad(c) \/ CCas(c)

\* SIGKILL: the lease word stays; a dead holder's term still counts (its
\* locals are dropped).
CCrash(c) ==
    /\ C[c].pc # "dead"
    /\ C' = [C EXCEPT ![c] = [CIdle EXCEPT !.pc = "dead", !.term = C[c].term]]
    /\ UNCHANGED <<t, bucket, L, setter, ghosts, lease, start, wrongRefusal>>

-----------------------------------------------------------------------------
Tick ==
    /\ t < MaxTime /\ t' = t + 1
    /\ UNCHANGED <<bucket, L, setter, ghosts, leasePart>>

Init ==
    /\ t = 0
    /\ tokens = T0 /\ rate = Rate0 /\ refilled = 0 /\ spent = 0
    /\ L = [l \in Launchers |-> LIdle]
    /\ spc = "s_swap" /\ sidx = 1
    /\ cred = [i \in 1..MaxTime |-> 0]
    /\ credited = 0 /\ discarded = 0 /\ forgiven = 0
    /\ lease = NoWord
    /\ start \in Starts
    /\ C = [c \in Ctrls |-> CIdle]
    /\ wrongRefusal = FALSE

Next == \/ Tick
        \/ \E l \in Launchers : LStep(l)
        \/ SStep
        \/ \E c \in Ctrls : CStep(c) \/ CCrash(c)

\* Weak fairness for the controllers only (part 2's liveness); the clock is
\* not forced to move.
Spec == Init /\ [][Next]_vars /\ \A c \in Ctrls : WF_vars(CStep(c))

-----------------------------------------------------------------------------
(* Properties of the bucket                                               *)

MaxRate == LET rs == {Rate0} \cup {RateSteps[i].r : i \in 1..Len(RateSteps)}
           IN CHOOSE m \in rs : \A r \in rs : r <= m

TypeOK ==
    /\ t \in 0..MaxTime /\ refilled \in 0..MaxTime
    /\ rate \in {Rate0} \cup {RateSteps[i].r : i \in 1..Len(RateSteps)}
    /\ \A l \in Launchers : L[l].pc \in {"l_idle", "r_clk", "r_last", "r_cas", "r_tload",
                                          "r_tcas", "c_spent", "c_sub", "w_rate", "w_debt"}
    /\ lease.h \in {0} \cup Ctrls /\ lease.e \in 0..(Wrap - 1)
    /\ \A c \in Ctrls : C[c].pc \in {"c_clk", "c_load", "c_cas", "dead"}

\* 1. Conservation: every token in the bucket was there at the start or
\* earned by a claimed interval, less what launches took, what the cap cut
\* off and what set_rate forgave; tokens in flight (earned by a refill that
\* has not yet done its tokens CAS, `owed`; added to `spent` and not yet
\* subtracted, `dbt`) are accounted.
Conservation ==
    tokens + SumOf("owed") + discarded = T0 + credited - (spent - SumOf("dbt")) + forgiven

\* With one rate throughout: the credit is the rate times the time refilled,
\* so tokens + owed + discarded = T0 + rate * (refilled_ns - 0) - applied.
CreditIsClock == Len(RateSteps) = 0 => credited = Rate0 * refilled

\* 2. Each interval is credited at most once, and every interval up to
\* refilled_ns has been claimed (at whatever rate the claimer read).
NoDoubleCredit == \A i \in 1..MaxTime : cred[i] <= 1
NoGap == \A i \in 1..MaxTime : i <= refilled => cred[i] = 1

\* A refill never fills the bucket above the cap (of the highest rate).
CapRespected == tokens <= Max(T0, MaxRate * Burst)

\* refilled_ns never goes back (an action property).
RefilledMonotonic == [][refilled' >= refilled]_refilled

-----------------------------------------------------------------------------
(* Properties of the lease                                                *)

\* c believes it controls the device under a term that has not ended.
InTerm(c) == t < C[c].term

\* 3. Lease exclusivity: no two processes hold terms (take_lease returned
\* true, not followed by a false) that both still run.
Exclusivity == \A c, d \in Ctrls : c # d => ~(InTerm(c) /\ InTerm(d))

\* 4a. A free lease (holder 0), one's own, or one that does not run by
\* lease_runs is never refused; the CAS then fails only when another CAS
\* came between.
FreeLeaseGranted == ~wrongRefusal

\* 4b. Whenever the device has no controller by the lease word, some process
\* eventually holds a running lease, unless every process is dead.
Controlled == lease.h # 0 /\ LeaseRuns(lease.e, MsAt(t))
AllDead == \A c \in Ctrls : C[c].pc = "dead"
LeaseTaken == ~Controlled ~> (Controlled \/ AllDead)

=============================================================================

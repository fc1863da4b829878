----------------------------- MODULE Accounting -----------------------------
(***************************************************************************)
(* Per-slot accounting under the slot's seqlock, admission against the    *)
(* limit, exit, crash and reaping: core/src/seqlock.rs, admission.rs and  *)
(* the usage side of slots.rs (release_on_exit, reap).  One device.       *)
(*                                                                         *)
(* Process p owns slot p (Slots.tla checks that slots are not shared).    *)
(* A slot holds `seq` (the seqlock), two counters written separately:     *)
(* `tot` (used[dev].total) and `kd` (the per-kind counter; one kind       *)
(* suffices: total = sum of the kinds is what a torn read breaks), and    *)
(* `occ` (pid # 0).  Every access is sequentially consistent here: the    *)
(* orderings (acquire/release, the SeqCst fence of Dekker's argument) are *)
(* loom's job (model/tests/loom_seqlock.rs, loom_admission.rs); this      *)
(* module checks the interleavings, crashes and reaping.                 *)
(*                                                                         *)
(* Writer, seqlock::write (one writer per slot: the slot's own process;   *)
(*   several threads of one process are serialised by the CAS even->odd,  *)
(*   which is loom's job): [seq odd] f [seq even].                        *)
(*   seqlock::add: tot += b, then kd += b.                                *)
(*   seqlock::sub: kd -= min(kd, b) (take_up_to), then tot -= what kd     *)
(*   lost; both saturate at 0 (no underflow).                             *)
(* admission::try_reserve (Retries re-checks, RETRIES = 2 in the code):   *)
(*   [a_*] add b in the own slot; [sum] device_usage: for each slot, if    *)
(*   pid # 0 add its total (one relaxed load per slot, not a snapshot);   *)
(*   sum <= Limit -> admitted; else [b_*] sub b, [sum2] device_usage      *)
(*   again; others + b > Limit -> OutOfMemory, else retry.                *)
(* admission::release: [l_*] sub b.                                       *)
(* slots::release_on_exit: force_zero (seq := seq | 1; tot := 0; kd := 0;  *)
(*   seq := seq + 1), then pid := 0.                                      *)
(* slots::reap (the Reaper, a periodic thread of a live process of ours; *)
(*   it runs under the owner lock, so reapers are serialised: one Reaper  *)
(*   here): a slot with pid # 0 whose process is dead: force_zero, pid 0. *)
(* seqlock::read (the Reader, tool/src/inspect.rs; reads slot RSlot):     *)
(*   up to ReadRetries times: s1 := seq; odd -> retry; load kd, load tot; *)
(*   seq = s1 -> return (consistent); then give up: return the loads,     *)
(*   marked inconsistent (reported as StuckSeqlock; a slot whose writer   *)
(*   died odd is left to the reaper, which force_zeroes it).              *)
(* SIGKILL at any step of a process: the slot keeps seq (possibly odd),   *)
(* tot, kd and pid until reaped.                                          *)
(*                                                                         *)
(* What the code guarantees, and what is checked (LimitRespected): the    *)
(* sum of ADMITTED usage (requests whose try_reserve returned Ok and that *)
(* are not yet released, exited or reaped) never exceeds the limit.  The  *)
(* sum of the slots' totals may exceed it for an instant, by requests     *)
(* that are reserved but not yet decided (the in-flight reservations of   *)
(* Dekker's argument); TotalsAccounted says exactly by how much.  C peers *)
(* check then act (B11) and can overshoot; they are not modelled here.   *)
(*                                                                         *)
(* Rounds bound each process's number of allocations (and so the seqlock *)
(* values); a process that has used them up exits normally.               *)
(***************************************************************************)
EXTENDS Naturals, FiniteSets, TLC

CONSTANTS
    Procs,        \* processes of ours = their slots (numbers 1..N)
    Req,          \* bytes each request reserves
    Limit,        \* the device's limit (> 0)
    Retries,      \* re-checks after a rollback (RETRIES)
    Rounds,       \* allocations per process
    ReadRetries,  \* READ_RETRIES
    RSlot,        \* the slot the Reader reads
    WithReader,   \* FALSE: no Reader (it is then done from the start)
    Bug           \* "none" or a planted bug

ASSUME Bug \in {"none", "check_then_act", "no_rollback", "reader_no_recheck",
                "reaper_skips_dead"}
ASSUME RSlot \in Procs

VARIABLES
    pc,      \* pc[p]
    tries,   \* tries[p]: reservation attempts so far in this request
    acc,     \* acc[p]: device_usage being summed
    idx,     \* idx[p]: next slot device_usage reads
    rounds,  \* rounds[p]: requests so far
    seq, tot, kd, occ,  \* the slots
    adm,     \* ghost: adm[p] = bytes admitted to p and not yet given back
    uf,      \* ghost: some sub had to saturate (an underflow was avoided)
    rpc, rs1, rkd, rtot, rtry, rok,  \* the Reader
    qpc, qs  \* the Reaper and the slot it is cleaning

vars == <<pc, tries, acc, idx, rounds, seq, tot, kd, occ, adm, uf,
          rpc, rs1, rkd, rtot, rtry, rok, qpc, qs>>
procVars   == <<pc, tries, acc, idx, rounds>>
slotVars   == <<seq, tot, kd, occ>>
readerVars == <<rpc, rs1, rkd, rtot, rtry, rok>>
reaperVars == <<qpc, qs>>

N == Cardinality(Procs)
Odd(x) == x % 2 = 1
Live(p) == pc[p] \notin {"dead", "gone"}
Sum(f) == LET S[T \in SUBSET Procs] ==
                 IF T = {} THEN 0 ELSE LET x == CHOOSE y \in T : TRUE IN f[x] + S[T \ {x}]
          IN S[Procs]
TakeUpTo(c, b) == IF c >= b THEN b ELSE c

Init ==
    /\ pc = [p \in Procs |-> "idle"]
    /\ tries = [p \in Procs |-> 0]
    /\ acc = [p \in Procs |-> 0]
    /\ idx = [p \in Procs |-> 1]
    /\ rounds = [p \in Procs |-> 0]
    /\ seq = [p \in Procs |-> 0]
    /\ tot = [p \in Procs |-> 0]
    /\ kd = [p \in Procs |-> 0]
    /\ occ = [p \in Procs |-> TRUE]
    /\ adm = [p \in Procs |-> 0]
    /\ uf = FALSE
    /\ rpc = (IF WithReader THEN "r_seq" ELSE "r_done") /\ rs1 = 0 /\ rkd = 0 /\ rtot = 0 /\ rtry = 0 /\ rok = FALSE
    /\ qpc = "q_pick" /\ qs = 0

Goto(p, s) == pc' = [pc EXCEPT ![p] = s]
Set(f, p, v) == f' = [f EXCEPT ![p] = v]

-----------------------------------------------------------------------------
(* A process of ours                                                      *)

\* Start a request (try_reserve), or exit normally once Rounds are used.
PIdle(p) ==
    /\ pc[p] = "idle"
    /\ IF rounds[p] < Rounds
          THEN /\ Set(rounds, p, rounds[p] + 1) /\ Set(tries, p, 1)
               /\ IF Bug = "check_then_act"
                     THEN Goto(p, "sum") /\ Set(idx, p, 1) /\ Set(acc, p, 0)
                     ELSE Goto(p, "a_begin") /\ UNCHANGED <<idx, acc>>
          ELSE FALSE  \* done: it stays (normal exit: see the header)
    /\ UNCHANGED <<slotVars, adm, uf, readerVars, reaperVars>>

\* seqlock::write + add: seq odd, tot += b, kd += b, seq even.
PABegin(p) ==
    /\ pc[p] = "a_begin"
    /\ Set(seq, p, seq[p] + 1) /\ Goto(p, "a_tot")
    /\ UNCHANGED <<tries, acc, idx, rounds, tot, kd, occ, adm, uf, readerVars, reaperVars>>
PATot(p) ==
    /\ pc[p] = "a_tot"
    /\ Set(tot, p, tot[p] + Req) /\ Goto(p, "a_kd")
    /\ UNCHANGED <<tries, acc, idx, rounds, seq, kd, occ, adm, uf, readerVars, reaperVars>>
PAKd(p) ==
    /\ pc[p] = "a_kd"
    /\ Set(kd, p, kd[p] + Req) /\ Goto(p, "a_end")
    /\ UNCHANGED <<tries, acc, idx, rounds, seq, tot, occ, adm, uf, readerVars, reaperVars>>
PAEnd(p) ==
    /\ pc[p] = "a_end"
    /\ Set(seq, p, seq[p] + 1)
    /\ IF Bug = "check_then_act"
          THEN Goto(p, "idle_hold") /\ UNCHANGED <<idx, acc>>
          ELSE Goto(p, "sum") /\ Set(idx, p, 1) /\ Set(acc, p, 0)
    /\ UNCHANGED <<tries, rounds, tot, kd, occ, adm, uf, readerVars, reaperVars>>

\* device_usage, one slot per step: pid # 0 -> add its total.
PSum(p) ==
    /\ pc[p] \in {"sum", "sum2"}
    /\ IF idx[p] <= N
          THEN /\ Set(acc, p, acc[p] + (IF occ[idx[p]] THEN tot[idx[p]] ELSE 0))
               /\ Set(idx, p, idx[p] + 1)
               /\ UNCHANGED <<pc, tries, adm>>
       ELSE IF pc[p] = "sum" THEN
          IF Bug = "check_then_act" THEN
             \* (bug) room for me?  Then add, without re-checking.
             IF acc[p] + Req <= Limit
                THEN Goto(p, "a_begin") /\ Set(acc, p, 0) /\ Set(idx, p, 1) /\ UNCHANGED <<tries, adm>>
                ELSE Goto(p, "idle") /\ Set(acc, p, 0) /\ Set(idx, p, 1) /\ UNCHANGED <<tries, adm>>
          ELSE IF acc[p] <= Limit
             THEN Goto(p, "hold") /\ Set(adm, p, Req) /\ Set(acc, p, 0) /\ Set(idx, p, 1)
                  /\ UNCHANGED tries
          ELSE IF Bug = "no_rollback"
             THEN Goto(p, "idle") /\ Set(acc, p, 0) /\ Set(idx, p, 1) /\ UNCHANGED <<tries, adm>>
          ELSE Goto(p, "b_begin") /\ Set(acc, p, 0) /\ Set(idx, p, 1) /\ UNCHANGED <<tries, adm>>
       ELSE \* sum2: others + b > limit -> OutOfMemory; else retry
          IF acc[p] + Req > Limit \/ tries[p] > Retries
             THEN Goto(p, "idle") /\ Set(acc, p, 0) /\ Set(idx, p, 1) /\ Set(tries, p, 0)
                  /\ UNCHANGED adm
             ELSE Goto(p, "a_begin") /\ Set(tries, p, tries[p] + 1)
                  /\ Set(acc, p, 0) /\ Set(idx, p, 1) /\ UNCHANGED adm
    /\ UNCHANGED <<rounds, slotVars, uf, readerVars, reaperVars>>

\* (check_then_act only) the add is done: the request is admitted.
PCtaHold(p) ==
    /\ pc[p] = "idle_hold"
    /\ Goto(p, "hold") /\ Set(adm, p, Req)
    /\ UNCHANGED <<tries, acc, idx, rounds, slotVars, uf, readerVars, reaperVars>>

\* seqlock::write + sub, for the rollback ([b_*]) and the release ([l_*]).
SubBegin(p, from, to) ==
    /\ pc[p] = from
    /\ Set(seq, p, seq[p] + 1) /\ Goto(p, to)
    /\ UNCHANGED <<tries, acc, idx, rounds, tot, kd, occ, adm, uf, readerVars, reaperVars>>
\* kind first; the amount it really lost is remembered in acc (scratch).
SubKd(p, from, to) ==
    /\ pc[p] = from
    /\ Set(kd, p, kd[p] - TakeUpTo(kd[p], Req))
    /\ Set(acc, p, TakeUpTo(kd[p], Req))
    /\ uf' = (uf \/ kd[p] < Req)
    /\ Goto(p, to)
    /\ UNCHANGED <<tries, idx, rounds, seq, tot, occ, adm, readerVars, reaperVars>>
SubTot(p, from, to) ==
    /\ pc[p] = from
    /\ Set(tot, p, tot[p] - TakeUpTo(tot[p], acc[p]))
    /\ uf' = (uf \/ tot[p] < acc[p])
    /\ Set(acc, p, 0)
    /\ Goto(p, to)
    /\ UNCHANGED <<tries, idx, rounds, seq, kd, occ, adm, readerVars, reaperVars>>
SubEnd(p, from, to) ==
    /\ pc[p] = from
    /\ Set(seq, p, seq[p] + 1) /\ Goto(p, to)
    /\ IF to = "sum2" THEN Set(idx, p, 1) /\ Set(acc, p, 0) ELSE UNCHANGED <<idx, acc>>
    /\ UNCHANGED <<tries, rounds, tot, kd, occ, adm, uf, readerVars, reaperVars>>

\* admission::release: the memory is freed first, so it stops counting as
\* admitted at once.
PRelease(p) ==
    /\ pc[p] = "hold"
    /\ Set(adm, p, 0) /\ Goto(p, "l_begin") /\ Set(tries, p, 0)
    /\ UNCHANGED <<acc, idx, rounds, slotVars, uf, readerVars, reaperVars>>

ForceOdd(s)  == seq' = [seq EXCEPT ![s] = IF Odd(seq[s]) THEN seq[s] ELSE seq[s] + 1]
ForceEven(s) == seq' = [seq EXCEPT ![s] = seq[s] + 1]

PStep(p) ==
    \/ PIdle(p) \/ PABegin(p) \/ PATot(p) \/ PAKd(p) \/ PAEnd(p) \/ PSum(p)
    \/ PCtaHold(p)
    \/ SubBegin(p, "b_begin", "b_kd") \/ SubKd(p, "b_kd", "b_tot")
    \/ SubTot(p, "b_tot", "b_end") \/ SubEnd(p, "b_end", "sum2")
    \/ PRelease(p)
    \/ SubBegin(p, "l_begin", "l_kd") \/ SubKd(p, "l_kd", "l_tot")
    \/ SubTot(p, "l_tot", "l_end") \/ SubEnd(p, "l_end", "idle")

\* SIGKILL at any step: the slot keeps everything; what was admitted stays
\* counted (adm) until the reaper frees the slot.
Crash(p) ==
    /\ Live(p)
    /\ Goto(p, "dead")
    /\ Set(tries, p, 0) /\ Set(acc, p, 0) /\ Set(idx, p, 1) /\ Set(rounds, p, 0)
    /\ UNCHANGED <<slotVars, adm, uf, readerVars, reaperVars>>

-----------------------------------------------------------------------------
(* The Reader: one seqlock::read of slot RSlot, at any time                *)

RSeq ==
    /\ rpc = "r_seq"
    /\ IF rtry >= ReadRetries
          THEN rpc' = "r_giveup" /\ UNCHANGED <<rs1, rtry>>
       ELSE IF Odd(seq[RSlot])
          THEN rtry' = rtry + 1 /\ UNCHANGED <<rpc, rs1>>
       ELSE rs1' = seq[RSlot] /\ rpc' = "r_kd" /\ UNCHANGED rtry
    /\ UNCHANGED <<rkd, rtot, rok>>
RKd ==
    /\ rpc = "r_kd"
    /\ rkd' = kd[RSlot] /\ rpc' = "r_tot"
    /\ UNCHANGED <<rs1, rtot, rtry, rok>>
RTot ==
    /\ rpc = "r_tot"
    /\ rtot' = tot[RSlot]
    /\ rpc' = IF Bug = "reader_no_recheck" THEN "r_done" ELSE "r_check"
    /\ rok' = (Bug = "reader_no_recheck")
    /\ UNCHANGED <<rs1, rkd, rtry>>
RCheck ==
    /\ rpc = "r_check"
    /\ IF seq[RSlot] = rs1
          THEN rpc' = "r_done" /\ rok' = TRUE /\ UNCHANGED rtry
          ELSE rpc' = "r_seq" /\ rtry' = rtry + 1 /\ UNCHANGED rok
    /\ UNCHANGED <<rs1, rkd, rtot>>
\* Out of retries: load the values and return them marked inconsistent.
RGiveUp ==
    /\ rpc = "r_giveup"
    /\ rkd' = kd[RSlot] /\ rtot' = tot[RSlot] /\ rok' = FALSE /\ rpc' = "r_done"
    /\ UNCHANGED <<rs1, rtry>>
ReaderStep == (RSeq \/ RKd \/ RTot \/ RCheck \/ RGiveUp)
              /\ UNCHANGED <<procVars, slotVars, adm, uf, reaperVars>>

-----------------------------------------------------------------------------
(* The Reaper: slots::reap                                                *)

Reapable(s) == occ[s] /\ pc[s] = "dead" /\ Bug # "reaper_skips_dead"
QPick ==
    /\ qpc = "q_pick"
    /\ \E s \in Procs : Reapable(s) /\ qs' = s /\ qpc' = "q_odd"
    /\ UNCHANGED <<seq, tot, kd, occ, adm>>
QOdd ==
    /\ qpc = "q_odd" /\ ForceOdd(qs) /\ qpc' = "q_zero"
    /\ UNCHANGED <<qs, tot, kd, occ, adm>>
QZero ==
    /\ qpc = "q_zero" /\ tot' = [tot EXCEPT ![qs] = 0] /\ kd' = [kd EXCEPT ![qs] = 0]
    /\ adm' = [adm EXCEPT ![qs] = 0]
    /\ qpc' = "q_even"
    /\ UNCHANGED <<qs, seq, occ>>
QEven ==
    /\ qpc = "q_even" /\ ForceEven(qs)
    /\ occ' = [occ EXCEPT ![qs] = FALSE]
    /\ qpc' = "q_pick" /\ qs' = 0
    /\ UNCHANGED <<tot, kd, adm>>

ReaperStep == (QPick \/ QOdd \/ QZero \/ QEven)
              /\ UNCHANGED <<procVars, uf, readerVars>>

-----------------------------------------------------------------------------
Next == \/ \E p \in Procs : PStep(p) \/ Crash(p)
        \/ ReaderStep
        \/ ReaperStep

Spec == /\ Init /\ [][Next]_vars
        /\ \A p \in Procs : WF_vars(PStep(p))
        /\ WF_vars(ReaderStep)
        /\ WF_vars(ReaperStep)

-----------------------------------------------------------------------------
(* Properties                                                             *)

MaxTot == Rounds * (Retries + 1) * Req
TypeOK ==
    /\ \A p \in Procs : tot[p] \in 0..MaxTot /\ kd[p] \in 0..MaxTot
    /\ \A p \in Procs : adm[p] \in {0, Req}
    /\ rpc \in {"r_seq", "r_kd", "r_tot", "r_check", "r_giveup", "r_done"}

\* The sum of admitted usage never exceeds the limit.
LimitRespected == Sum(adm) <= Limit

\* Where the slots' totals stand against that: every slot's total is what
\* its process was admitted plus its one undecided reservation, if any.
Reserved(p)  == pc[p] \in {"a_kd", "a_end", "sum", "b_begin", "b_kd", "b_tot"}
Releasing(p) == pc[p] \in {"l_begin", "l_kd", "l_tot"}
TotalsAccounted ==
    \A p \in Procs :
       Live(p) => tot[p] = adm[p] + (IF Reserved(p) \/ Releasing(p) THEN Req ELSE 0)

\* No leak: a process between requests (or holding one) has exactly what it
\* was admitted in its slot; a refused request leaves nothing behind.
NoLeak == \A p \in Procs : pc[p] \in {"idle", "hold"} => tot[p] = adm[p] /\ kd[p] = adm[p]

\* A read reported consistent is not torn: total = the sum of the kinds.
UntornRead == (rpc = "r_done" /\ rok) => rtot = rkd

\* No counter ever had to saturate (no release of more than was added).
NoUnderflow == ~uf

\* Liveness: a dead process's usage is eventually zero (the reaper).
DeadUsageZero ==
    \A p \in Procs : (pc[p] = "dead" /\ tot[p] + kd[p] > 0) ~> (tot[p] = 0 /\ kd[p] = 0)

\* Liveness: the reader always returns, even on a slot whose writer died
\* with the sequence odd.
ReaderReturns == <>(rpc = "r_done")

=============================================================================

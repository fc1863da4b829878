-------------------------- MODULE ContextAdmission --------------------------
(***************************************************************************)
(* Admission of CUDA contexts against the device limit (issue 17):        *)
(* core::context (plan, publish, ...) and the hooks that create contexts. *)
(* One device, one context per process.                                   *)
(*                                                                         *)
(* Shared state (the region):                                              *)
(*   cost      the measured cost of a context; 0 = unknown.  Published by *)
(*             fetch_max (once, never lowered).                           *)
(*   probe     the probe lease: 0 free, else the pid of the process that  *)
(*             measures the first context.  Released by CAS(me, 0).       *)
(*   res[p]    p's reservation: what admission counts.  Reserve(p, n) is  *)
(*             one step that succeeds iff Sum(res) + Foreign + n <= L.    *)
(*             Accounting.tla proves the "only if" of admission::         *)
(*             try_reserve (never over the limit), not the "if": it adds, *)
(*             sums and rolls back, so overlapping reservers can all be   *)
(*             refused where one fits.  Optimistic = TRUE models that for *)
(*             ReserveKnown (the herd's contended step), and the retry    *)
(*             that restores the "if" (finding 8).                        *)
(*   real[p]   what the driver really holds for p: C from the moment the  *)
(*             create call starts until the destroy call has RETURNED, or *)
(*             until the process's exit is complete after a crash.        *)
(*   Foreign   a constant amount, reserved and really used, by something  *)
(*             outside this protocol (a C peer); 0 except in the _lim_.   *)
(* Per process: pc, kc (the cost it loaded), sp (the probe value it       *)
(* loaded, for the CAS), tries (back-off witness only), and the ghost     *)
(* outcome ("none" until the process is told "created" or "refused").    *)
(*                                                                         *)
(* The protocol (Bug = "none"); [pc] before each action:                  *)
(*   [begin]  Begin: kc := cost.load.                                     *)
(*   [plan]   Plan = plan(kc, probe.load), the probe loaded AFTER cost:   *)
(*            probe held by another process whose lease is valid -> Wait  *)
(*            ([waiting]), EVEN IF kc # 0; else kc # 0 -> Reserve(kc)     *)
(*            ([reserve_known]); else -> Probe ([take_probe]).            *)
(*   [waiting] Wait: sleep, then [begin] again (bounded by a timeout in   *)
(*            the code; a plain loop here).                               *)
(*   [take_probe] TakeProbe: CAS(probe, seen, me); failed -> [begin].     *)
(*   [recheck] Recheck: cost.load # 0 (someone published between our      *)
(*            Begin and our CAS) -> release the probe, [reserve_known].   *)
(*   [reserve_probe] ReserveProbe: Reserve(p, L - Foreign - Sum(res)),    *)
(*            the whole free part; if that is 0 -> [refuse_probe].        *)
(*   [confirm] Confirm: cost.load # 0 -> give the reservation back,       *)
(*            release the probe, [reserve_known] (fires only when a lease *)
(*            was taken over from a live holder: Expiry = "any").         *)
(*   [create_probe] Create: the driver call starts, real[p] = C.          *)
(*   [measure_probe] Measure: m = C; m <= res[p] -> [publish]; else the   *)
(*            context does not fit: [pb_destroy] Destroy, [pb_wait]       *)
(*            DestroyReturns, [pb_release] Release (res[p] := 0),         *)
(*            [pb_publish] Publish, [refuse_probe] Refuse.                *)
(*   [publish] Publish: cost := max(cost, m).                              *)
(*   [shrink] Shrink: res[p] := m (publish BEFORE shrink: see below).     *)
(*   [release_probe] ReleaseProbe: CAS(probe, me, 0); "created".          *)
(*   [refuse_probe] Refuse: CAS(probe, me, 0); "refused" (OUT_OF_MEMORY). *)
(*   [reserve_known] ReserveKnown: Reserve(p, kc): refused -> "refused";  *)
(*            admitted -> [create_known] Create, [measure_known] Measure: *)
(*            m <= res[p] -> "created"; else [grow] (never with a         *)
(*            constant C: NeverGrows).                                     *)
(*            Optimistic: ReserveKnown adds kc to res[p] ([rk_check]);    *)
(*            CheckKnown: Sum(res) + Foreign <= L -> [create_known], else *)
(*            [rk_rollback] RollbackKnown takes kc back; [rk_room]        *)
(*            RoomKnown: the free part read again, kc fits -> contention: *)
(*            [reserve_known] again (create_at_cost's retry, after a      *)
(*            wait); else "refused".                                      *)
(*   [created] (Destroys) Destroy, [d_wait] DestroyReturns (real := 0),  *)
(*            [d_release] Release (res := 0), [finished].                 *)
(*   Crash (Crashes): SIGKILL at any step -> [dying]: real, res and the   *)
(*            probe stay.  Exit: the process's exit completes, the driver *)
(*            has freed its memory (real := 0), its pid is gone: [dead].  *)
(*            Reap: the reaper frees a [dead] process's reservation.      *)
(*   The lease is valid while its holder is not [dead] (Expiry = "dead": *)
(*   liveness, pid + start tag); Expiry = "any" models a lease that       *)
(*   expires on a timer, so it may be taken over at any moment, even from *)
(*   a live holder.                                                        *)
(*                                                                         *)
(* Design changes found by TLC (spec/README.md, ContextAdmission,        *)
(* findings 1-5):                                                          *)
(*  - plan() waits on a held probe even when the cost is known, and loads *)
(*    cost before probe.  Otherwise a process that sees the cost just     *)
(*    published reserves it while the prober still holds the whole free  *)
(*    part (before its Shrink) and is refused for nothing:                *)
(*    _wit_known_ignores_probe, _wit_probe_loaded_first -> HerdProgress.  *)
(*    (Shrink before Publish would also fix it, but only for a lease     *)
(*    judged by liveness; see the next point.)                            *)
(*  - Publish before Shrink, and Confirm after ReserveProbe, because a    *)
(*    lease that expires on a timer can be taken over from a live prober: *)
(*    _wit_shrink_before_publish, _wit_no_confirm -> RealWithinLimit      *)
(*    (Expiry = "any").                                                    *)
(*  - Recheck after TakeProbe: _wit_no_recheck -> HerdProgress.           *)
(*  - Reap only after the exit is complete: _wit_reap_before_exit.        *)
(*  - (Finding 8, found by shuttle with the real code.)  A known cost      *)
(*    refused while it still fits in the free part read after the        *)
(*    rollback is reserved again: with try_reserve's bounded re-checks    *)
(*    alone, two reservers wanting the last place both give up:           *)
(*    ContextAdmissionOptimistic_wit_final_refusal -> HerdExact.  The     *)
(*    retry can livelock in lock-step under weak fairness                 *)
(*    (_lim_livelock -> HerdProgress); timing and the deadline end it.    *)
(*                                                                         *)
(* Planted bugs (Bug):                                                     *)
(*   estimate_grow      today: Reserve(E) [est_reserve], Create, Measure, *)
(*                      Grow by C - E, refused -> Destroy, DestroyReturns,*)
(*                      Release, "refused".                               *)
(*   backoff_everyone   the same, but a refusal (of the reservation or of *)
(*                      the grow) backs off and retries, Retries times.   *)
(*   no_probe           cost unknown -> Reserve(E) without the lease,     *)
(*                      Create, Measure, Publish, Grow.                   *)
(*   release_before_destroy  a created context: Release, then Destroy.    *)
(*   known_ignores_probe     plan: kc # 0 -> Reserve(kc) whatever probe.  *)
(*   probe_loaded_first      Begin loads probe, Plan loads cost.          *)
(*   no_recheck / no_confirm  the step left out.                          *)
(*   shrink_before_publish   Shrink, then Publish.                        *)
(*   reap_before_exit   Reap also frees a [dying] process's reservation.  *)
(*   final_refusal      (Optimistic) the code before finding 8: RoomKnown *)
(*                      retries only Retries times (try_reserve's own     *)
(*                      RETRIES re-checks), then "refused" even if kc fits.*)
(***************************************************************************)
EXTENDS Naturals, FiniteSets, TLC

CONSTANTS
    Procs,     \* the processes (pids 1..N)
    L,         \* the device limit
    C,         \* the real cost of a context
    E,         \* the estimate of today's design (witnesses only)
    Foreign,   \* reserved and used by a C peer, constant (0 but in _lim_)
    Retries,   \* back-off retries (backoff_everyone only)
    Destroys,  \* created contexts are destroyed later
    Crashes,   \* Crash / Exit / Reap enabled
    Expiry,    \* "dead": lease taken over from a dead holder only; "any": at any time
    Optimistic, \* ReserveKnown as try_reserve does it: add, check, roll back (finding 8)
    Bug

ASSUME Bug \in {"none", "estimate_grow", "backoff_everyone", "no_probe",
                "release_before_destroy", "known_ignores_probe",
                "probe_loaded_first", "no_recheck", "no_confirm",
                "shrink_before_publish", "reap_before_exit", "final_refusal"}
ASSUME Expiry \in {"dead", "any"}
ASSUME Optimistic \in BOOLEAN /\ (Bug = "final_refusal" => Optimistic)
\* A process killed with kc in flight leaves it counted, not admitted, until
\* it is reaped: Accounting.tla's case, not modelled here.
ASSUME Optimistic => ~Crashes
ASSUME C > 0 /\ E > 0 /\ L >= Foreign
ASSUME Procs \subseteq (Nat \ {0})

VARIABLES pc, cost, probe, res, real, kc, sp, tries, outcome

vars == <<pc, cost, probe, res, real, kc, sp, tries, outcome>>

N == Cardinality(Procs)
K == (L - Foreign) \div C          \* contexts that fit
Min(a, b) == IF a < b THEN a ELSE b
Max(a, b) == IF a > b THEN a ELSE b
Sum(f) == LET S[T \in SUBSET Procs] ==
                 IF T = {} THEN 0 ELSE LET x == CHOOSE y \in T : TRUE IN f[x] + S[T \ {x}]
          IN S[Procs]
Free == L - Foreign - Sum(res)
CanReserve(n) == Sum(res) + Foreign + n <= L
\* CAS(probe, p, 0)
Rel(p) == IF probe = p THEN 0 ELSE probe

Init ==
    /\ pc = [p \in Procs |-> "begin"]
    /\ cost = 0
    /\ probe = 0
    /\ res = [p \in Procs |-> 0]
    /\ real = [p \in Procs |-> 0]
    /\ kc = [p \in Procs |-> 0]
    /\ sp = [p \in Procs |-> 0]
    /\ tries = [p \in Procs |-> 0]
    /\ outcome = [p \in Procs |-> "none"]

Goto(p, s) == pc' = [pc EXCEPT ![p] = s]
Set(f, p, v) == f' = [f EXCEPT ![p] = v]
Decide(p, o) == outcome' = [outcome EXCEPT ![p] = o]

-----------------------------------------------------------------------------
(* Planning                                                               *)

Begin(p) ==
    /\ pc[p] = "begin"
    /\ CASE Bug \in {"estimate_grow", "backoff_everyone"} ->
              Goto(p, "est_reserve") /\ UNCHANGED <<kc, sp>>
         [] Bug = "no_probe" ->
              IF cost # 0 THEN Goto(p, "reserve_known") /\ Set(kc, p, cost) /\ UNCHANGED sp
                          ELSE Goto(p, "est_reserve") /\ UNCHANGED <<kc, sp>>
         [] Bug = "probe_loaded_first" ->
              Goto(p, "plan") /\ Set(sp, p, probe) /\ UNCHANGED kc
         [] OTHER ->
              Goto(p, "plan") /\ Set(kc, p, cost) /\ UNCHANGED sp
    /\ UNCHANGED <<cost, probe, res, real, tries, outcome>>

\* plan(cost, probe).  cv, pv: the values loaded (in this order: cost in
\* Begin, probe now; the bug loads them the other way round).
Plan(p) ==
    LET cv == IF Bug = "probe_loaded_first" THEN cost ELSE kc[p]
        pv == IF Bug = "probe_loaded_first" THEN sp[p] ELSE probe
        \* held by another process that liveness says is not dead
        held == pv \notin {0, p} /\ pc[pv] # "dead"
        \* the lease may be taken (free, dead holder, or expired on a timer)
        takable == ~held \/ Expiry = "any"
        ignore == Bug = "known_ignores_probe" /\ cv # 0
    IN
    /\ pc[p] = "plan"
    /\ \/ /\ held /\ ~ignore
          /\ Goto(p, "waiting") /\ Set(kc, p, 0) /\ Set(sp, p, 0)
       \/ /\ cv # 0 /\ (takable \/ ignore)
          /\ Goto(p, "reserve_known") /\ Set(kc, p, cv) /\ Set(sp, p, 0)
       \/ /\ cv = 0 /\ takable
          /\ Goto(p, "take_probe") /\ Set(sp, p, pv) /\ Set(kc, p, 0)
    /\ UNCHANGED <<cost, probe, res, real, tries, outcome>>

Wait(p) ==
    /\ pc[p] = "waiting"
    /\ Goto(p, "begin")
    /\ UNCHANGED <<cost, probe, res, real, kc, sp, tries, outcome>>

-----------------------------------------------------------------------------
(* The prober                                                             *)

TakeProbe(p) ==
    /\ pc[p] = "take_probe"
    /\ IF probe = sp[p]
          THEN probe' = p /\ Goto(p, IF Bug = "no_recheck" THEN "reserve_probe" ELSE "recheck")
          ELSE UNCHANGED probe /\ Goto(p, "begin")
    /\ Set(sp, p, 0)
    /\ UNCHANGED <<cost, res, real, kc, tries, outcome>>

Recheck(p) ==
    /\ pc[p] = "recheck"
    /\ IF cost # 0
          THEN probe' = Rel(p) /\ Set(kc, p, cost) /\ Goto(p, "reserve_known")
          ELSE UNCHANGED <<probe, kc>> /\ Goto(p, "reserve_probe")
    /\ UNCHANGED <<cost, res, real, sp, tries, outcome>>

ReserveProbe(p) ==
    /\ pc[p] = "reserve_probe"
    /\ IF Free > 0
          THEN Set(res, p, res[p] + Free)
               /\ Goto(p, IF Bug = "no_confirm" THEN "create_probe" ELSE "confirm")
          ELSE UNCHANGED res /\ Goto(p, "refuse_probe")
    /\ UNCHANGED <<cost, probe, real, kc, sp, tries, outcome>>

Confirm(p) ==
    /\ pc[p] = "confirm"
    /\ IF cost = 0
          THEN Goto(p, "create_probe") /\ UNCHANGED <<res, probe, kc>>
          ELSE /\ Set(res, p, 0) /\ probe' = Rel(p) /\ Set(kc, p, cost)
               /\ Goto(p, "reserve_known")
    /\ UNCHANGED <<cost, real, sp, tries, outcome>>

Refuse(p) ==
    /\ pc[p] = "refuse_probe"
    /\ probe' = Rel(p) /\ Goto(p, "refused") /\ Decide(p, "refused")
    /\ UNCHANGED <<cost, res, real, kc, sp, tries>>

Publish(p) ==
    /\ pc[p] \in {"publish", "pb_publish", "publish_est"}
    /\ cost' = Max(cost, C)
    /\ Goto(p, CASE pc[p] = "publish" ->
                      IF Bug = "shrink_before_publish" THEN "release_probe" ELSE "shrink"
                 [] pc[p] = "pb_publish" -> "refuse_probe"
                 [] pc[p] = "publish_est" -> "grow")
    /\ UNCHANGED <<probe, res, real, kc, sp, tries, outcome>>

Shrink(p) ==
    /\ pc[p] = "shrink"
    /\ Set(res, p, C)
    /\ Goto(p, IF Bug = "shrink_before_publish" THEN "publish" ELSE "release_probe")
    /\ UNCHANGED <<cost, probe, real, kc, sp, tries, outcome>>

ReleaseProbe(p) ==
    /\ pc[p] = "release_probe"
    /\ probe' = Rel(p) /\ Goto(p, "created") /\ Decide(p, "created")
    /\ UNCHANGED <<cost, res, real, kc, sp, tries>>

-----------------------------------------------------------------------------
(* Known cost, and the estimate of the witnesses                          *)

ReserveKnown(p) ==
    /\ pc[p] = "reserve_known"
    /\ IF Optimistic
          THEN Set(res, p, res[p] + kc[p]) /\ Goto(p, "rk_check") /\ UNCHANGED <<kc, outcome>>
          ELSE /\ IF CanReserve(kc[p])
                     THEN Set(res, p, res[p] + kc[p]) /\ Goto(p, "create_known")
                          /\ UNCHANGED outcome
                     ELSE UNCHANGED res /\ Goto(p, "refused") /\ Decide(p, "refused")
               /\ Set(kc, p, 0)
    /\ UNCHANGED <<cost, probe, real, sp, tries>>

\* Optimistic: try_reserve sums the slots, its own kc included; over the
\* limit -> [rk_rollback], a step of its own: it takes kc back.
CheckKnown(p) ==
    /\ pc[p] = "rk_check"
    /\ IF Sum(res) + Foreign <= L
          THEN Goto(p, "create_known") /\ Set(kc, p, 0)
          ELSE Goto(p, "rk_rollback") /\ UNCHANGED kc
    /\ UNCHANGED <<cost, probe, res, real, sp, tries, outcome>>

RollbackKnown(p) ==
    /\ pc[p] = "rk_rollback"
    /\ Goto(p, "rk_room") /\ Set(res, p, res[p] - kc[p])
    /\ UNCHANGED <<cost, probe, real, kc, sp, tries, outcome>>

\* Optimistic, after a rollback: kc still fits in the free part (what stood
\* in the way was others' in-flight bytes) -> reserve again (after a wait,
\* bounded by the deadline in the code); else "refused".  final_refusal
\* retries Retries times only.
RoomKnown(p) ==
    /\ pc[p] = "rk_room"
    /\ IF Free >= kc[p] /\ (Bug = "final_refusal" => tries[p] < Retries)
          THEN /\ Goto(p, "reserve_known") /\ UNCHANGED <<kc, outcome>>
               /\ IF Bug = "final_refusal" THEN Set(tries, p, tries[p] + 1) ELSE UNCHANGED tries
          ELSE /\ Goto(p, "refused") /\ Decide(p, "refused") /\ Set(kc, p, 0)
               /\ UNCHANGED tries
    /\ UNCHANGED <<cost, probe, res, real, sp>>

\* Back off and retry (backoff_everyone) or give up.
FailEst(p) ==
    IF Bug = "backoff_everyone" /\ tries[p] < Retries
       THEN Goto(p, "est_reserve") /\ Set(tries, p, tries[p] + 1) /\ UNCHANGED outcome
       ELSE Goto(p, "refused") /\ Decide(p, "refused") /\ UNCHANGED tries

ReserveEstimate(p) ==
    /\ pc[p] = "est_reserve"
    /\ IF CanReserve(E)
          THEN Set(res, p, res[p] + E) /\ Goto(p, "create_est") /\ UNCHANGED <<tries, outcome>>
          ELSE UNCHANGED res /\ FailEst(p)
    /\ UNCHANGED <<cost, probe, real, kc, sp>>

-----------------------------------------------------------------------------
(* The context                                                            *)

Create(p) ==
    /\ pc[p] \in {"create_probe", "create_known", "create_est"}
    /\ Set(real, p, C)
    /\ Goto(p, [create_probe |-> "measure_probe", create_known |-> "measure_known",
                create_est |-> "measure_est"][pc[p]])
    /\ UNCHANGED <<cost, probe, res, kc, sp, tries, outcome>>

Measure(p) ==
    /\ pc[p] \in {"measure_probe", "measure_known", "measure_est"}
    /\ IF C <= res[p]
          THEN IF pc[p] = "measure_probe"
                  THEN Goto(p, IF Bug = "shrink_before_publish" THEN "shrink" ELSE "publish")
                       /\ UNCHANGED outcome
                  ELSE Goto(p, "created") /\ Decide(p, "created")
          ELSE /\ Goto(p, CASE pc[p] = "measure_probe" -> "pb_destroy"
                            [] pc[p] = "measure_known" -> "grow"
                            [] OTHER -> IF Bug = "no_probe" THEN "publish_est" ELSE "grow")
               /\ UNCHANGED outcome
    /\ UNCHANGED <<cost, probe, res, real, kc, sp, tries>>

\* Grow the reservation to the measured cost (never in the design).
Grow(p) ==
    /\ pc[p] = "grow"
    /\ IF CanReserve(C - res[p])
          THEN Set(res, p, C) /\ Goto(p, "created") /\ Decide(p, "created")
          ELSE UNCHANGED <<res, outcome>> /\ Goto(p, "g_destroy")
    /\ UNCHANGED <<cost, probe, real, kc, sp, tries>>

\* The destroy call starts; the driver still holds the memory.
Destroy(p) ==
    /\ \/ pc[p] = "g_destroy" /\ Goto(p, "g_wait")
       \/ pc[p] = "pb_destroy" /\ Goto(p, "pb_wait")
       \/ pc[p] = "created" /\ Destroys /\ Bug # "release_before_destroy" /\ Goto(p, "d_wait")
       \/ pc[p] = "rb_destroy" /\ Goto(p, "rb_wait")
    /\ UNCHANGED <<cost, probe, res, real, kc, sp, tries, outcome>>

\* The destroy call returns: the driver has freed the context.
DestroyReturns(p) ==
    /\ pc[p] \in {"g_wait", "pb_wait", "d_wait", "rb_wait"}
    /\ Set(real, p, 0)
    /\ Goto(p, [g_wait |-> "g_release", pb_wait |-> "pb_release", d_wait |-> "d_release",
                rb_wait |-> "finished"][pc[p]])
    /\ UNCHANGED <<cost, probe, res, kc, sp, tries, outcome>>

\* Give the reservation back.
Release(p) ==
    /\ \/ pc[p] = "g_release" /\ FailEst(p)
       \/ pc[p] = "pb_release" /\ Goto(p, "pb_publish") /\ UNCHANGED <<tries, outcome>>
       \/ pc[p] = "d_release" /\ Goto(p, "finished") /\ UNCHANGED <<tries, outcome>>
       \/ /\ pc[p] = "created" /\ Destroys /\ Bug = "release_before_destroy"
          /\ Goto(p, "rb_destroy") /\ UNCHANGED <<tries, outcome>>
    /\ Set(res, p, 0)
    /\ UNCHANGED <<cost, probe, real, kc, sp>>

-----------------------------------------------------------------------------
(* Crash, exit, reaping                                                   *)

Crash(p) ==
    /\ Crashes
    /\ pc[p] \notin {"dying", "dead", "refused", "finished"}
    /\ Goto(p, "dying") /\ Set(kc, p, 0) /\ Set(sp, p, 0)
    /\ UNCHANGED <<cost, probe, res, real, tries, outcome>>

\* The exit completes: the driver has freed everything p held; its pid is gone.
Exit(p) ==
    /\ pc[p] = "dying"
    /\ Goto(p, "dead") /\ Set(real, p, 0)
    /\ UNCHANGED <<cost, probe, res, kc, sp, tries, outcome>>

Reap(p) ==
    /\ pc[p] = "dead" \/ (Bug = "reap_before_exit" /\ pc[p] = "dying")
    /\ res[p] > 0
    /\ Set(res, p, 0)
    /\ UNCHANGED <<pc, cost, probe, real, kc, sp, tries, outcome>>

-----------------------------------------------------------------------------
PStep(p) ==
    \/ Begin(p) \/ Plan(p) \/ Wait(p)
    \/ TakeProbe(p) \/ Recheck(p) \/ ReserveProbe(p) \/ Confirm(p) \/ Refuse(p)
    \/ Publish(p) \/ Shrink(p) \/ ReleaseProbe(p)
    \/ ReserveKnown(p) \/ CheckKnown(p) \/ RollbackKnown(p) \/ RoomKnown(p) \/ ReserveEstimate(p)
    \/ Create(p) \/ Measure(p) \/ Grow(p)
    \/ Destroy(p) \/ DestroyReturns(p) \/ Release(p)

Next == \E p \in Procs : PStep(p) \/ Crash(p) \/ Exit(p) \/ Reap(p)

Spec == /\ Init /\ [][Next]_vars
        /\ \A p \in Procs : WF_vars(PStep(p)) /\ WF_vars(Exit(p)) /\ WF_vars(Reap(p))

-----------------------------------------------------------------------------
(* Properties                                                             *)

PCs == {"begin", "plan", "waiting", "take_probe", "recheck", "reserve_probe", "confirm",
        "refuse_probe", "create_probe", "measure_probe", "publish", "shrink",
        "release_probe", "reserve_known", "rk_check", "rk_rollback", "rk_room", "create_known", "measure_known",
        "est_reserve", "create_est", "measure_est", "publish_est", "grow",
        "g_destroy", "g_wait", "g_release", "pb_destroy", "pb_wait", "pb_release",
        "pb_publish", "created", "d_wait", "d_release", "rb_destroy", "rb_wait",
        "refused", "finished", "dying", "dead"}
TypeOK ==
    /\ pc \in [Procs -> PCs]
    /\ cost \in {0, C}
    /\ probe \in Procs \cup {0}
    /\ res \in [Procs -> 0..L]
    /\ real \in [Procs -> {0, C}]
    /\ outcome \in [Procs -> {"none", "created", "refused"}]

\* The GPU memory really in use, contexts being created included.
RealWithinLimit == Sum(real) + Foreign <= L
\* Reserved and admitted: kc added by an Optimistic ReserveKnown is in flight
\* until CheckKnown admits it or RollbackKnown takes it back (the sum of res
\* may pass L by it for an instant).
Held == [p \in Procs |-> IF pc[p] \in {"rk_check", "rk_rollback"} THEN res[p] - kc[p]
                                                                ELSE res[p]]
ReservedWithinLimit == Sum(Held) + Foreign <= L
\* Why RealWithinLimit holds: the driver never holds more for a process
\* than it has reserved (a dying process keeps both until Exit and Reap).
RealReserved == \A p \in Procs : real[p] <= res[p]
\* The measured cost never exceeds what was reserved for it.
NeverGrows == \A p \in Procs : pc[p] # "grow"
\* Under a lease taken over from dead holders only, Confirm always finds
\* cost = 0 (it is needed only for a lease that expires on a timer).
ConfirmPasses == \A p \in Procs : pc[p] = "confirm" => cost = 0

Decided(p) == outcome[p] # "none"
NCreated == Cardinality({p \in Procs : outcome[p] = "created"})
\* Every process is eventually told "created" or "refused".
EachDecides == \A p \in Procs : <>Decided(p)
\* N processes start together: all are told, and Min(N, K) get a context.
HerdProgress == <>((\A p \in Procs : Decided(p)) /\ NCreated = Min(N, K))
\* Once all N are told, Min(N, K) got a context: no refusal where one fit.
\* A safety property, for Optimistic, where HerdProgress fails (finding 8).
HerdExact == (\A p \in Procs : Decided(p)) => NCreated = Min(N, K)

=============================================================================

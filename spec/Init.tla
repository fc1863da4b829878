-------------------------------- MODULE Init --------------------------------
(***************************************************************************)
(* Initialisation of the shared region: init::ensure_initialised.          *)
(*                                                                         *)
(* The region's `initialized_flag` is 0 (fresh file), INIT_IN_PROGRESS (1, *)
(* written only by us, only under lockf) or MAGIC (19920718).  The init    *)
(* lock is lockf() on the region's bytes, as HAMi-core takes it; the      *)
(* kernel releases it when its holder dies.                               *)
(*                                                                         *)
(* Ours (pc values in brackets):                                          *)
(*   [start]   one acquire load of the flag; MAGIC -> [ready] (fast path:  *)
(*             nothing else is read or written)                           *)
(*   [lock]    Platform::init_lock (lockf F_LOCK)                         *)
(*   [recheck] re-read the flag under the lock; MAGIC -> unlock, [ready]. *)
(*             0 or 1: initialise.  1 means a previous initialiser died    *)
(*             holding the lock (1 is only ever written under it), so we  *)
(*             take over; nobody waits on 1.                              *)
(*   [mark]    flag := 1                                                  *)
(*   [write]   write the fields (versions, limits, sem_init, ...), one     *)
(*             step per field; a crash leaves any prefix written           *)
(*   [publish] flag := MAGIC (release store)                              *)
(*   [unlock]  Platform::init_unlock -> [ready]                           *)
(* C peers (HAMi-core HEAD try_create_shrreg): always lockf, then if the  *)
(* flag is not MAGIC write the fields and store MAGIC last; they never    *)
(* write 1 and have no fast path.                                         *)
(*                                                                         *)
(* Not modelled: the lockf timeout of Platform::init_lock (a holder that  *)
(* is alive and makes progress releases the lock; on a timeout we fall    *)
(* back to degraded mode, which is not "ready"); C peers' unconditional   *)
(* store of last_kernel_time under the lock (a timestamp, not an init     *)
(* field); layout/version/size detection (a property of the bytes, not of *)
(* the interleaving).  PR155-tip peers (CAS init without lockf) are L1    *)
(* layout and are refused by size, so they never share a file with us.    *)
(*                                                                         *)
(* Bugs excluded: B20 (flag left at 1 by a dead initialiser wedges        *)
(* everyone: we take over under the lock), half-initialised reads (MAGIC  *)
(* is stored last, with release), double initialisation (lockf + re-read).*)
(***************************************************************************)
EXTENDS Naturals, FiniteSets, TLC

CONSTANTS
    RProcs,    \* our processes (numbers)
    CProcs,    \* C HAMi-core peers (numbers)
    NFields,   \* how many separately written init fields
    Bug        \* "none" | "magic_first" | "no_lockf" | "wait_in_progress"

ASSUME Bug \in {"none", "magic_first", "no_lockf", "wait_in_progress"}
ASSUME RProcs \cap CProcs = {}

Procs    == RProcs \cup CProcs
MAGIC    == 19920718
INPROG   == 1
NoProc   == 0
Fields   == 1..NFields

VARIABLES
    flag,     \* initialized_flag
    written,  \* the init fields written so far (a set of field numbers)
    lk,       \* holder of the lockf lock, or NoProc
    pc,       \* pc[p]
    idx,      \* idx[p]: next field p writes
    rewrote   \* ghost: some field was written while flag = MAGIC

vars == <<flag, written, lk, pc, idx, rewrote>>

States == {"start", "spin", "lock", "recheck", "mark", "write", "publish",
           "unlock", "ready", "dead"}

Goto(p, s) == pc' = [pc EXCEPT ![p] = s]

Init ==
    /\ flag = 0
    /\ written = {}
    /\ lk = NoProc
    /\ pc = [p \in Procs |-> IF p \in RProcs THEN "start" ELSE "lock"]
    /\ idx = [p \in Procs |-> 1]
    /\ rewrote = FALSE

-----------------------------------------------------------------------------
\* Fast path: one acquire load.  Bug wait_in_progress: a flag of 1 is taken
\* to mean "someone else is initialising": wait for it to change.
Start(p) ==
    /\ pc[p] = "start"
    /\ Goto(p, IF flag = MAGIC THEN "ready"
               ELSE IF Bug = "wait_in_progress" /\ flag = INPROG THEN "spin"
               ELSE "lock")
    /\ UNCHANGED <<flag, written, lk, idx, rewrote>>

\* (Bug wait_in_progress only) blocked until the flag is no longer 1.
Spin(p) ==
    /\ pc[p] = "spin" /\ flag # INPROG
    /\ Goto(p, "start")
    /\ UNCHANGED <<flag, written, lk, idx, rewrote>>

\* lockf(F_LOCK).  Bug no_lockf: skip it.
Lock(p) ==
    /\ pc[p] = "lock"
    /\ IF Bug = "no_lockf" /\ p \in RProcs
          THEN lk' = lk
          ELSE lk = NoProc /\ lk' = p
    /\ Goto(p, "recheck")
    /\ UNCHANGED <<flag, written, idx, rewrote>>

Recheck(p) ==
    /\ pc[p] = "recheck"
    /\ IF flag = MAGIC
          THEN /\ lk' = IF lk = p THEN NoProc ELSE lk
               /\ Goto(p, "ready")
       ELSE IF Bug = "wait_in_progress" /\ p \in RProcs /\ flag = INPROG
          THEN /\ lk' = IF lk = p THEN NoProc ELSE lk
               /\ Goto(p, "spin")
       ELSE /\ lk' = lk
            /\ Goto(p, IF p \in CProcs THEN "write"
                       ELSE IF Bug = "magic_first" THEN "publish"
                       ELSE "mark")
    /\ idx' = [idx EXCEPT ![p] = 1]
    /\ UNCHANGED <<flag, written, rewrote>>

Mark(p) ==
    /\ pc[p] = "mark"
    /\ flag' = INPROG
    /\ Goto(p, "write")
    /\ UNCHANGED <<written, lk, idx, rewrote>>

Write(p) ==
    /\ pc[p] = "write"
    /\ written' = written \cup {idx[p]}
    /\ rewrote' = (rewrote \/ flag = MAGIC)
    /\ idx' = [idx EXCEPT ![p] = idx[p] + 1]
    /\ Goto(p, IF idx[p] < NFields THEN "write"
               ELSE IF Bug = "magic_first" /\ p \in RProcs THEN "unlock"
               ELSE "publish")
    /\ UNCHANGED <<flag, lk>>

\* flag := MAGIC, last (release).  Bug magic_first: before the fields.
Publish(p) ==
    /\ pc[p] = "publish"
    /\ flag' = MAGIC
    /\ Goto(p, IF Bug = "magic_first" /\ p \in RProcs THEN "write" ELSE "unlock")
    /\ UNCHANGED <<written, lk, idx, rewrote>>

Unlock(p) ==
    /\ pc[p] = "unlock"
    /\ lk' = IF lk = p THEN NoProc ELSE lk
    /\ Goto(p, "ready")
    /\ UNCHANGED <<flag, written, idx, rewrote>>

Step(p) == Start(p) \/ Spin(p) \/ Lock(p) \/ Recheck(p) \/ Mark(p)
           \/ Write(p) \/ Publish(p) \/ Unlock(p)

\* SIGKILL at any step before ready (a crash after ready changes nothing
\* here).  The kernel releases lockf; the region keeps what was written.
Crash(p) ==
    /\ pc[p] \notin {"ready", "dead"}
    /\ Goto(p, "dead")
    /\ lk' = IF lk = p THEN NoProc ELSE lk
    /\ UNCHANGED <<flag, written, idx, rewrote>>

Next == \E p \in Procs : Step(p) \/ Crash(p)

Spec == Init /\ [][Next]_vars /\ \A p \in Procs : WF_vars(Step(p))

-----------------------------------------------------------------------------
TypeOK ==
    /\ flag \in {0, INPROG, MAGIC}
    /\ written \subseteq Fields
    /\ lk \in Procs \cup {NoProc}
    /\ pc \in [Procs -> States]
    /\ idx \in [Procs -> 1..(NFields + 1)]
    /\ rewrote \in BOOLEAN

\* No process uses the region before every field is written.
NoHalfInitRead == \A p \in Procs : pc[p] = "ready" => written = Fields

\* At most one process is between its decision to initialise and its unlock.
InInit(p) == pc[p] \in {"mark", "write", "publish", "unlock"}
OneInitialiser == \A p, q \in Procs : InInit(p) /\ InInit(q) => p = q

\* Once MAGIC, no init field is ever written again.
NoRewriteAfterMagic == ~rewrote

\* MAGIC is stable.
MagicStable == [][flag = MAGIC => flag' = MAGIC]_vars

\* The fast path: a process of ours that finds MAGIC goes straight to ready.
FastPathOneLoad ==
    [][\A p \in RProcs : (pc[p] = "start" /\ flag = MAGIC /\ pc'[p] # "start")
                          => pc'[p] \in {"ready", "dead"}]_vars

\* Every process that does not crash becomes ready (crashes are not forced:
\* they are not fair).
AllReady == \A p \in Procs : <>(pc[p] \in {"ready", "dead"})

=============================================================================

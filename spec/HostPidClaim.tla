---------------------------- MODULE HostPidClaim ----------------------------
(***************************************************************************)
(* The host-pid claim (core/src/host_pid.rs `claim`, `claimed_by_others`; *)
(* core/src/fields.rs `ProcSlot::claim_hostpid`, `withdraw_hostpid`,      *)
(* `claimed_hostpid`).  Each slot has `pid` (non-zero while occupied;     *)
(* only zero/non-zero matters to the claim, so it is the boolean `sLive`) *)
(* and `hostpid` (`sHost`, 0 = none).  Every access is seq-cst, so        *)
(* interleaving semantics are exact: one shared access per step.          *)
(*                                                                         *)
(* claim(v), one access per step:                                         *)
(*   pick   choose a candidate v (NVML's list, a probe: any of Cands),    *)
(*          then CAS(own hostpid, 0, v); success, or the slot already     *)
(*          holds v -> go on; it holds another value -> Preset(cur): the  *)
(*          process keeps cur as its host pid                             *)
(*   range  load proc_num (live_range)                                    *)
(*   scan   for every other slot i < proc_num, one at a time: load pid;   *)
(*          non-zero -> load hostpid; = v -> Conflict (stop)              *)
(*   end of the scan -> Won                                               *)
(*   withdraw (Conflict): CAS(own hostpid, v, 0); then retry with a new   *)
(*          candidate, at most MaxTries claims (0 = unbounded)            *)
(*                                                                         *)
(* Slots (core/src/slots.rs), under the owner lock, each one step:        *)
(*   occupy (claim: lowest hole in [0, proc_num), else append): every     *)
(*          field reset, hostpid := 0 included, pid stored last           *)
(*   free   (release_on_exit at exit, or the reaper for a dead process):  *)
(*          pid := 0; hostpid is NOT touched and stays stale: readers     *)
(*          skip it because they load pid first                           *)
(* A process exits or is killed at any step (`Exits`); `Reap` frees its   *)
(* slot right after (release_on_exit_if_idle with no usage counted) or    *)
(* any time later (the reaper, for a killed process or one that exited    *)
(* with usage counted).  A process that is gone may come back as a new    *)
(* process (MaxSpawns) and take a freed slot.                             *)
(*                                                                         *)
(* Not modelled: HAMi's monitor or the C API writing hostpid (set_hostpid)*)
(* -- in the model a slot's hostpid is written only by its own process    *)
(* (and reset by occupy), so Preset is reachable only by a bug; PID reuse *)
(* of the container pid (occupy resets the slot just the same); how the  *)
(* candidate is found (ffi/src/hooks/host_pid.rs).                        *)
(*                                                                         *)
(* Bugs (witnesses):                                                      *)
(*   check_then_claim  scan first, then CAS (shuttle's mutant)            *)
(*   no_reread         CAS, then Won without the scan                     *)
(*   occupy_keeps_host occupy leaves hostpid as it was: a new process in  *)
(*                     a freed slot inherits a stale host pid as Preset   *)
(*   no_pid_check      readers take hostpid of freed slots too: safety   *)
(*                     holds (the same states: a slot freed between the   *)
(*                     two loads is read anyway), ObstructionFree fails   *)
(***************************************************************************)
EXTENDS Naturals, FiniteSets, TLC

CONSTANTS
    Procs,      \* process identities (numbers); each may come back once gone
    NS,         \* slots in the table
    Cands,      \* candidate host pids (numbers > 0)
    MaxTries,   \* claims per process (0 = unbounded)
    MaxSpawns,  \* new processes in all
    Exits,      \* processes may exit or be killed (FALSE: the livelock only)
    Bug

ASSUME Bug \in {"none", "check_then_claim", "no_reread", "occupy_keeps_host", "no_pid_check"}
ASSUME 0 \notin Cands

SlotIdx == 0..(NS - 1)
NoSlot  == NS
Claiming == {"pick", "range", "scan_pid", "scan_host", "cas", "withdraw"}
Holding  == {"won", "preset"}
VARIABLES
    pc,      \* per process
    slot,    \* its slot index, NoSlot before occupy
    cand,    \* the candidate being claimed; after Preset, the preset value
    idx,     \* next slot the scan loads
    lim,     \* proc_num as the scan loaded it
    tries,   \* claims started
    spawns,
    sLive,   \* procs[i].pid # 0
    sHost,   \* procs[i].hostpid
    procNum  \* proc_num

vars == <<pc, slot, cand, idx, lim, tries, spawns, sLive, sHost, procNum>>
local == <<slot, cand, idx, lim, tries>>

\* Alive: not gone (a process killed mid-claim is "gone").
Live(a) == pc[a] # "gone"
Min(S) == CHOOSE i \in S : \A j \in S : i <= j
Goto(a, s) == pc' = [pc EXCEPT ![a] = s]
Mine(a) == slot[a]
\* Slot i belongs to a live process.
Owned(i) == \E a \in Procs : Live(a) /\ slot[a] = i

Init ==
    /\ pc = [a \in Procs |-> "start"]
    /\ slot = [a \in Procs |-> NoSlot]
    /\ cand = [a \in Procs |-> 0]
    /\ idx = [a \in Procs |-> 0]
    /\ lim = [a \in Procs |-> 0]
    /\ tries = [a \in Procs |-> 0]
    /\ spawns = 0
    /\ sLive = [i \in SlotIdx |-> FALSE]
    /\ sHost = [i \in SlotIdx |-> 0]
    /\ procNum = 0

-----------------------------------------------------------------------------
(* Slots                                                                  *)

\* slots::claim + occupy: the lowest hole in [0, proc_num), else append.
Occupy(a) ==
    /\ pc[a] = "start"
    /\ LET holes == {i \in 0..(procNum - 1) : ~sLive[i]}
           i == IF holes # {} THEN Min(holes) ELSE procNum
       IN /\ i < NS
          /\ sLive' = [sLive EXCEPT ![i] = TRUE]
          /\ sHost' = IF Bug = "occupy_keeps_host" THEN sHost ELSE [sHost EXCEPT ![i] = 0]
          /\ procNum' = IF i = procNum THEN procNum + 1 ELSE procNum
          /\ slot' = [slot EXCEPT ![a] = i]
    /\ Goto(a, "pick")
    /\ UNCHANGED <<cand, idx, lim, tries, spawns>>

\* Exit or SIGKILL at any step: the slot stays occupied until Reap frees
\* it (next step or later).  The process's locals are reset so that TLC
\* merges equivalent states.
Exit(a) ==
    /\ Exits /\ Live(a)
    /\ Goto(a, "gone")
    /\ slot' = [slot EXCEPT ![a] = NoSlot]
    /\ cand' = [cand EXCEPT ![a] = 0]
    /\ idx' = [idx EXCEPT ![a] = 0]
    /\ lim' = [lim EXCEPT ![a] = 0]
    /\ tries' = [tries EXCEPT ![a] = 0]
    /\ UNCHANGED <<spawns, sLive, sHost, procNum>>

\* slots::free (release_on_exit, or slots::reap): a dead process's slot is
\* freed, pid := 0; hostpid is kept (stale).
Reap(i) ==
    /\ sLive[i] /\ ~Owned(i)
    /\ sLive' = [sLive EXCEPT ![i] = FALSE]
    /\ UNCHANGED <<pc, local, spawns, sHost, procNum>>

Respawn(a) ==
    /\ pc[a] = "gone" /\ spawns < MaxSpawns
    /\ spawns' = spawns + 1
    /\ Goto(a, "start")
    /\ UNCHANGED <<local, sLive, sHost, procNum>>

-----------------------------------------------------------------------------
(* The claim                                                              *)

\* Conflict handled: retry with a new candidate, or give up.  (Locals a
\* process no longer needs are reset so that TLC merges equivalent states.)
Retry(a) ==
    /\ idx' = [idx EXCEPT ![a] = 0]
    /\ lim' = [lim EXCEPT ![a] = 0]
    /\ IF MaxTries # 0 /\ tries[a] + 1 >= MaxTries THEN
          /\ tries' = [tries EXCEPT ![a] = 0]
          /\ cand' = [cand EXCEPT ![a] = 0]
          /\ Goto(a, "given_up")
       ELSE
          /\ tries' = [tries EXCEPT ![a] = IF MaxTries = 0 THEN 0 ELSE @ + 1]
          /\ Goto(a, "pick")
          /\ UNCHANGED cand

\* Returned (Won, Preset): the claim's locals are reset.
Done(a, s) ==
    /\ Goto(a, s)
    /\ idx' = [idx EXCEPT ![a] = 0]
    /\ lim' = [lim EXCEPT ![a] = 0]
    /\ tries' = [tries EXCEPT ![a] = 0]

\* CAS(own hostpid, 0, v) (the slot holds v already: Ok as well), then
\* `next`; another value: Preset(cur), kept as the host pid.
CasThen(a, v, next) ==
    LET cur == sHost[Mine(a)] IN
    IF cur = 0 \/ cur = v THEN
       /\ sHost' = [sHost EXCEPT ![Mine(a)] = v]
       /\ cand' = [cand EXCEPT ![a] = v]
       /\ IF next = "won" THEN Done(a, "won")
          ELSE Goto(a, next) /\ UNCHANGED <<idx, lim, tries>>
    ELSE
       /\ cand' = [cand EXCEPT ![a] = cur]
       /\ Done(a, "preset")
       /\ UNCHANGED sHost

Pick(a) ==
    /\ pc[a] = "pick"
    /\ \E v \in Cands :
          IF Bug = "check_then_claim" THEN
             /\ cand' = [cand EXCEPT ![a] = v]
             /\ Goto(a, "range")
             /\ UNCHANGED <<sHost, idx, lim, tries>>
          ELSE CasThen(a, v, IF Bug = "no_reread" THEN "won" ELSE "range")
    /\ UNCHANGED <<slot, spawns, sLive, procNum>>

\* The scan goes on at slot j (own slot skipped: a local test) of a range
\* of l slots; past the end it returns Won (check_then_claim: goes to CAS).
ScanAt(a, j, l) ==
    LET n == IF j = Mine(a) THEN j + 1 ELSE j IN
    IF n >= l THEN
       IF Bug = "check_then_claim" THEN
          Goto(a, "cas") /\ idx' = [idx EXCEPT ![a] = 0] /\ lim' = [lim EXCEPT ![a] = 0]
          /\ UNCHANGED tries
       ELSE Done(a, "won")
    ELSE
       Goto(a, "scan_pid") /\ idx' = [idx EXCEPT ![a] = n] /\ lim' = [lim EXCEPT ![a] = l]
       /\ UNCHANGED tries

\* Load proc_num (live_range).
Range(a) ==
    /\ pc[a] = "range"
    /\ ScanAt(a, 0, procNum)
    /\ UNCHANGED <<slot, cand, spawns, sLive, sHost, procNum>>

\* Load procs[idx].pid: zero -> next slot; else load its hostpid.
ScanPid(a) ==
    /\ pc[a] = "scan_pid"
    /\ IF ~sLive[idx[a]] /\ Bug # "no_pid_check"
          THEN ScanAt(a, idx[a] + 1, lim[a])
          ELSE Goto(a, "scan_host") /\ UNCHANGED <<idx, lim, tries>>
    /\ UNCHANGED <<slot, cand, spawns, sLive, sHost, procNum>>

\* Load procs[idx].hostpid: = v -> Conflict.
ScanHost(a) ==
    /\ pc[a] = "scan_host"
    /\ IF sHost[idx[a]] = cand[a] THEN
          IF Bug = "check_then_claim" THEN Retry(a)
          ELSE Goto(a, "withdraw") /\ idx' = [idx EXCEPT ![a] = 0]
               /\ lim' = [lim EXCEPT ![a] = 0] /\ UNCHANGED <<tries, cand>>
       ELSE ScanAt(a, idx[a] + 1, lim[a]) /\ UNCHANGED cand
    /\ UNCHANGED <<slot, spawns, sLive, sHost, procNum>>

\* CAS(own hostpid, v, 0), then retry (or give up).
Withdraw(a) ==
    /\ pc[a] = "withdraw"
    /\ sHost' = IF sHost[Mine(a)] = cand[a] THEN [sHost EXCEPT ![Mine(a)] = 0] ELSE sHost
    /\ Retry(a)
    /\ UNCHANGED <<slot, spawns, sLive, procNum>>

\* check_then_claim only: the CAS after the scan.
Cas(a) ==
    /\ pc[a] = "cas"
    /\ CasThen(a, cand[a], "won")
    /\ UNCHANGED <<slot, spawns, sLive, procNum>>

Claim(a) == Pick(a) \/ Range(a) \/ ScanPid(a) \/ ScanHost(a) \/ Withdraw(a) \/ Cas(a)

Next ==
    \/ \E a \in Procs : Occupy(a) \/ Claim(a) \/ Exit(a) \/ Respawn(a)
    \/ \E i \in SlotIdx : Reap(i)

\* Weak fairness of each process's own steps; exits, reaps and respawns are
\* never forced.
Spec == Init /\ [][Next]_vars /\ \A a \in Procs : WF_vars(Occupy(a) \/ Claim(a))

-----------------------------------------------------------------------------
(* Properties                                                             *)

TypeOK ==
    /\ pc \in [Procs -> {"start", "won", "preset", "given_up", "gone"} \cup Claiming]
    /\ slot \in [Procs -> SlotIdx \cup {NoSlot}]
    /\ cand \in [Procs -> Cands \cup {0}]
    /\ idx \in [Procs -> 0..NS]
    /\ lim \in [Procs -> 0..NS]
    /\ tries \in [Procs -> 0..MaxTries]
    /\ sLive \in [SlotIdx -> BOOLEAN]
    /\ sHost \in [SlotIdx -> Cands \cup {0}]
    /\ procNum \in 0..NS

\* No two live processes that returned Won (or Preset) and have not exited
\* since hold the same host pid.
NoDoubleWin ==
    \A a, b \in Procs :
        (a # b /\ pc[a] \in Holding /\ pc[b] \in Holding) => cand[a] # cand[b]

\* A winner's slot is occupied and holds the pid it won, while it lives.
WinnerHolds ==
    \A a \in Procs : pc[a] = "won" => sLive[Mine(a)] /\ sHost[Mine(a)] = cand[a]

\* A process that withdrew (about to retry, or given up) holds nothing.
WithdrawnHoldsNothing ==
    \A a \in Procs : pc[a] \in {"pick", "given_up"} => sHost[Mine(a)] = 0

\* Liveness (availability, not safety; with MaxTries = 0, unbounded).
\* Obstruction freedom: a claimant alone (every other process gone, every
\* other slot freed) wins, unless it exits.
Alone(a) == /\ pc[a] \in Claiming
            /\ \A b \in Procs \ {a} : pc[b] = "gone"
            /\ \A i \in SlotIdx \ {Mine(a)} : ~sLive[i]
ObstructionFree == \A a \in Procs : Alone(a) ~> pc[a] \in {"won", "gone"}
\* Some process wins (fails: two claimants may withdraw in lock-step forever).
SomeoneWins == <>(\E a \in Procs : pc[a] = "won")

=============================================================================

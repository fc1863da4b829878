-------------------------------- MODULE Slots -------------------------------
(***************************************************************************)
(* The slot table: SLOTS entries `procs[i]` with `pid`, the usage counters *)
(* and (our extension, `unused[0]`) the owner's start tag, plus          *)
(* `proc_num`.  The table's structure (claims, reaping, C compaction)     *)
(* changes only under the owner lock, abstracted here as a mutex `lk`    *)
(* that a crash releases at once (OwnerLock.tla checks the real lock).    *)
(* Usage is abstracted to the SET of incarnations <<pid, tag>> that have  *)
(* added usage to a slot (empty set = all counters zero).                 *)
(*                                                                         *)
(* Ours:                                                                   *)
(*   slots::claim (under the lock):                                       *)
(*     1. a slot in [0, proc_num) with my pid: a previous incarnation of  *)
(*        my pid that died; reset its usage, write my tag                 *)
(*     2. else the lowest hole (pid 0) in [0, proc_num)                   *)
(*     3. else append: write slot proc_num, then proc_num := proc_num + 1 *)
(*     4. else (full) reap once, retry; still full -> degraded mode (no   *)
(*        slot, the process runs unaccounted and says so)                 *)
(*     Our claim never moves a slot.                                      *)
(*   hot path (lock-free): before each update re-validate                 *)
(*     procs[mySlot].pid = my pid (a C peer may have moved us); if not,    *)
(*     re-find by pid in [0, proc_num), else claim again; then add usage.  *)
(*   slots::release_on_exit (exit or catchable signal, lock-free):        *)
(*     usage := 0 (and tag := 0), then pid := 0.                          *)
(*   slots::reap (under the lock, bounded: one slot per call here, also   *)
(*     run periodically off the hot path): a slot whose owner is dead, or *)
(*     a hole that still carries usage (a C peer's exit, B7): usage := 0, *)
(*     then pid := 0.                                                     *)
(*   Owner liveness of a slot: the tag word is <<pid, tag>> (pid in the   *)
(*     low half): it is trusted only if its pid half equals the slot's    *)
(*     pid; otherwise it is stale (left by an occupant before a C peer    *)
(*     took the slot, since C never writes unused[0]) and the slot is     *)
(*     judged by pid only.  (Bug tag_unbound: trust any non-zero tag.)    *)
(* SIGKILL: the slot stays with its pid, tag and usage until reaped.      *)
(*                                                                         *)
(* C peers (HAMi-core HEAD init_proc_slot_withlock / clear_proc_slot /   *)
(* exit_handler): under the lock, reuse the slot with their pid or append *)
(* (exit(-1) when full: B30); then compact: repeatedly move the last     *)
(* slot into a hole or a pid-dead slot and decrement proc_num (the tag    *)
(* word copied or not: both are explored; the source keeps its bytes).   *)
(* They never write unused[0].  On exit: pid := 0, usage kept (B7).  Their *)
(* own usage updates are modelled as ideal (by pid); their stale-pointer  *)
(* bugs (B3) are theirs.  Unlocked compaction (B4) is not modelled.       *)
(*                                                                         *)
(* Bugs excluded: B3/B3a/B3b/B5/B6 on our side (we never move slots), B7  *)
(* (exit zeroes usage first; reap clears holes with usage), B21 (a dead   *)
(* slot is judged by pid AND tag, and a reused pid resets its own slot),  *)
(* B22 partly (reuse rewrites the slot), B30 (reap before giving up; full *)
(* table -> degraded, not exit).                                          *)
(***************************************************************************)
EXTENDS Naturals, FiniteSets, TLC

CONSTANTS
    RActors,      \* our processes (numbers; also initial pids and tags)
    CActors,      \* C peers (numbers)
    SLOTS,        \* table size
    RespawnPids,  \* pids of new processes (PID reuse)
    MaxSpawns,    \* bound on respawns
    CCompact,     \* C peers compact the table
    CPidReuse,    \* C peers may also be respawned, with pids from RespawnPids
    Bug

ASSUME Bug \in {"none", "no_reuse_check", "compacting_claim",
                "release_pid_first", "tag_unbound", "reap_skips_holes"}

Actors  == RActors \cup CActors
NA      == Cardinality(Actors)
SlotIdx == 0..(SLOTS - 1)
NoSlot  == SLOTS
NoWord  == <<0, 0>>
Pids    == Actors \cup RespawnPids
Tags    == 1..(NA + MaxSpawns)
Words   == {NoWord} \cup (Pids \X Tags)
Incs    == Pids \X Tags

VARIABLES
    pc, pid, tag, mySlot, reaped, spawns,
    sPid,      \* procs[i].pid
    sWord,     \* procs[i].unused[0]: <<pid, tag>> as written by us
    usage,     \* procs[i].used[..]: the incarnations that added to it
    procNum,   \* proc_num
    lk,        \* holder of the (abstract) owner lock, or 0
    movedLive, \* ghost: one of OUR actions moved a live process's slot
    reapedLive \* ghost: a reap cleared the slot of a live process

vars == <<pc, pid, tag, mySlot, reaped, spawns, sPid, sWord, usage, procNum,
          lk, movedLive, reapedLive>>
procVars  == <<pid, tag, spawns>>
ghostVars == <<movedLive, reapedLive>>

Min(S) == CHOOSE i \in S : \A j \in S : i <= j
Live(x) == pc[x] \notin {"dead", "gone"}
PidLive(p) == \E x \in Actors : Live(x) /\ pid[x] = p
Me(a) == <<pid[a], tag[a]>>
Goto(a, s) == pc' = [pc EXCEPT ![a] = s]
\* Exit for good: forget pid, tag and slot (see Crash).
Leave(a) == /\ pc' = [pc EXCEPT ![a] = "gone"]
            /\ pid' = [pid EXCEPT ![a] = 0]
            /\ tag' = [tag EXCEPT ![a] = 0]
            /\ mySlot' = [mySlot EXCEPT ![a] = NoSlot]
InRange == 0..(procNum - 1)

\* Platform::liveness for a slot's owner, as slots::reap uses it.
TagTrusted(i) == sWord[i] # NoWord /\ (sWord[i][1] = sPid[i] \/ Bug = "tag_unbound")
SlotOwnerLive(i) ==
    IF TagTrusted(i)
       THEN \E x \in Actors : Live(x) /\ pid[x] = sPid[i] /\ tag[x] = sWord[i][2]
       ELSE PidLive(sPid[i])
\* Bug reap_skips_holes: only slots with a pid are reaped.
Reapable(i) == \/ sPid[i] # 0 /\ ~SlotOwnerLive(i)
               \/ sPid[i] = 0 /\ usage[i] # {} /\ Bug # "reap_skips_holes"

RHolding == {"unlock", "run", "u_write", "x_usage", "x_pid"}
CHolding == {"c_compact", "c_unlock", "c_run"}
HasSlot(x) == pc[x] \in RHolding \cup CHolding /\ mySlot[x] # NoSlot
\* Slot i is, in truth, the slot of a live process (it claimed it and its
\* pid is still there).
BelongsToLive(i) == \E x \in Actors : HasSlot(x) /\ mySlot[x] = i /\ sPid[i] = pid[x]

Init ==
    /\ pc = [a \in Actors |-> IF a \in RActors THEN "start" ELSE "c_start"]
    /\ pid = [a \in Actors |-> a]
    /\ tag = [a \in Actors |-> a]
    /\ mySlot = [a \in Actors |-> NoSlot]
    /\ reaped = [a \in Actors |-> FALSE]
    /\ spawns = 0
    /\ sPid = [i \in SlotIdx |-> 0]
    /\ sWord = [i \in SlotIdx |-> NoWord]
    /\ usage = [i \in SlotIdx |-> {}]
    /\ procNum = 0
    /\ lk = 0
    /\ movedLive = FALSE
    /\ reapedLive = FALSE

-----------------------------------------------------------------------------
(* Ours                                                                   *)

RStart(a) ==
    /\ pc[a] = "start" /\ lk = 0
    /\ lk' = a
    /\ reaped' = [reaped EXCEPT ![a] = FALSE]
    /\ Goto(a, "claim")
    /\ UNCHANGED <<procVars, mySlot, sPid, sWord, usage, procNum, ghostVars>>

\* slots::claim, one decision per step, under the lock.
RClaim(a) ==
    /\ pc[a] = "claim"
    /\ LET mine  == {i \in InRange : sPid[i] = pid[a]}
           holes == {i \in InRange : sPid[i] = 0}
       IN
       IF mine # {} /\ Bug # "no_reuse_check" THEN
          \* 1. a dead incarnation of my pid: reset and take it over
          LET i == Min(mine) IN
          /\ usage' = [usage EXCEPT ![i] = {}]
          /\ sWord' = [sWord EXCEPT ![i] = Me(a)]
          /\ mySlot' = [mySlot EXCEPT ![a] = i]
          /\ Goto(a, "unlock")
          /\ UNCHANGED <<reaped, sPid, procNum, ghostVars>>
       ELSE IF holes # {} /\ Bug = "compacting_claim" THEN
          \* (bug) fill the hole with the last slot, as HAMi-core does
          LET h == Min(holes)
              l == procNum - 1 IN
          /\ sPid'  = [sPid  EXCEPT ![h] = sPid[l]]
          /\ sWord' = [sWord EXCEPT ![h] = sWord[l]]
          /\ usage' = [usage EXCEPT ![h] = usage[l]]
          /\ procNum' = l
          /\ movedLive' = (movedLive \/ (h # l /\ BelongsToLive(l)))
          /\ UNCHANGED <<pc, reaped, mySlot, reapedLive>>
       ELSE IF holes # {} THEN
          \* 2. the lowest hole: usage first, then pid
          LET h == Min(holes) IN
          /\ usage' = [usage EXCEPT ![h] = {}]
          /\ sWord' = [sWord EXCEPT ![h] = Me(a)]
          /\ sPid'  = [sPid  EXCEPT ![h] = pid[a]]
          /\ mySlot' = [mySlot EXCEPT ![a] = h]
          /\ Goto(a, "unlock")
          /\ UNCHANGED <<reaped, procNum, ghostVars>>
       ELSE IF procNum < SLOTS THEN
          \* 3. append: write the slot, then publish proc_num + 1 (one step
          \*    here: under the lock, and lock-free readers are not modelled)
          /\ usage' = [usage EXCEPT ![procNum] = {}]
          /\ sWord' = [sWord EXCEPT ![procNum] = Me(a)]
          /\ sPid'  = [sPid  EXCEPT ![procNum] = pid[a]]
          /\ procNum' = procNum + 1
          /\ mySlot' = [mySlot EXCEPT ![a] = procNum]
          /\ Goto(a, "unlock")
          /\ UNCHANGED <<reaped, ghostVars>>
       ELSE IF ~reaped[a] THEN
          \* 4. full: reap once and retry
          /\ reaped' = [reaped EXCEPT ![a] = TRUE]
          /\ Goto(a, "reap")
          /\ UNCHANGED <<mySlot, sPid, sWord, usage, procNum, ghostVars>>
       ELSE
          \* still full: degraded mode
          /\ mySlot' = [mySlot EXCEPT ![a] = NoSlot]
          /\ Goto(a, "unlock")
          /\ UNCHANGED <<reaped, sPid, sWord, usage, procNum, ghostVars>>
    /\ UNCHANGED <<procVars, lk>>

\* slots::reap: clear at most one reapable slot (usage, then pid).
ReapOne ==
    LET R == {i \in InRange : Reapable(i)} IN
    IF R = {} THEN UNCHANGED <<sPid, sWord, usage, reapedLive>>
    ELSE LET i == Min(R) IN
         /\ usage' = [usage EXCEPT ![i] = {}]
         /\ sWord' = [sWord EXCEPT ![i] = NoWord]
         /\ sPid'  = [sPid  EXCEPT ![i] = 0]
         /\ reapedLive' = (reapedLive \/ BelongsToLive(i))

RReap(a) ==
    /\ pc[a] = "reap"
    /\ ReapOne
    /\ Goto(a, "claim")
    /\ UNCHANGED <<procVars, mySlot, reaped, procNum, lk, movedLive>>

RUnlock(a) ==
    /\ pc[a] = "unlock"
    /\ lk' = 0
    /\ reaped' = [reaped EXCEPT ![a] = FALSE]
    /\ Goto(a, IF mySlot[a] = NoSlot THEN "degraded" ELSE "run")
    /\ UNCHANGED <<procVars, mySlot, sPid, sWord, usage, procNum, ghostVars>>

Valid(a) == mySlot[a] < procNum /\ sPid[mySlot[a]] = pid[a]
Refind(a) == {i \in InRange : sPid[i] = pid[a]}

\* Hot path: re-validate, re-find by pid, or claim again.
RUse(a) ==
    /\ pc[a] = "run"
    /\ IF Valid(a) THEN Goto(a, "u_write") /\ UNCHANGED mySlot
       ELSE IF Refind(a) # {} THEN
               mySlot' = [mySlot EXCEPT ![a] = Min(Refind(a))] /\ UNCHANGED pc
       ELSE mySlot' = [mySlot EXCEPT ![a] = NoSlot] /\ Goto(a, "start")
    /\ UNCHANGED <<procVars, reaped, sPid, sWord, usage, procNum, lk, ghostVars>>

\* The atomic add (accounting::SlotWriter) on the validated slot.
RUWrite(a) ==
    /\ pc[a] = "u_write"
    /\ usage' = [usage EXCEPT ![mySlot[a]] = @ \cup {Me(a)}]
    /\ Goto(a, "run")
    /\ UNCHANGED <<procVars, mySlot, reaped, sPid, sWord, procNum, lk, ghostVars>>

\* slots::release_on_exit, step 1: re-validate, then usage := 0 (and the
\* tag).  Bug release_pid_first: pid := 0 first.
RXUsage(a) ==
    /\ pc[a] \in {"run", "x_usage"}
    /\ IF Valid(a) THEN
          /\ UNCHANGED <<pid, tag>>
          /\ IF Bug = "release_pid_first"
                THEN sPid' = [sPid EXCEPT ![mySlot[a]] = 0] /\ UNCHANGED <<usage, sWord>>
                ELSE /\ usage' = [usage EXCEPT ![mySlot[a]] = {}]
                     /\ sWord' = [sWord EXCEPT ![mySlot[a]] = NoWord]
                     /\ UNCHANGED sPid
          /\ Goto(a, "x_pid") /\ UNCHANGED mySlot
       ELSE IF Refind(a) # {} THEN
          mySlot' = [mySlot EXCEPT ![a] = Min(Refind(a))]
          /\ Goto(a, "x_usage")
          /\ UNCHANGED <<pid, tag, sPid, sWord, usage>>
       ELSE Leave(a) /\ UNCHANGED <<sPid, sWord, usage>>
    /\ UNCHANGED <<spawns, reaped, procNum, lk, ghostVars>>

RXPid(a) ==
    /\ pc[a] = "x_pid"
    /\ IF Bug = "release_pid_first"
          THEN /\ usage' = [usage EXCEPT ![mySlot[a]] = {}]
               /\ sWord' = [sWord EXCEPT ![mySlot[a]] = NoWord]
               /\ UNCHANGED sPid
          ELSE sPid' = [sPid EXCEPT ![mySlot[a]] = 0] /\ UNCHANGED <<usage, sWord>>
    /\ Leave(a)
    /\ UNCHANGED <<spawns, reaped, procNum, lk, ghostVars>>

\* Periodic reaping off the hot path (a background thread of a running
\* process, so it may run while the main thread is anywhere in the hot
\* path): take the lock, reap one, unlock, as one atomic step (every other
\* structural change also happens under the lock).
RPReap(a) ==
    /\ pc[a] \in {"run", "u_write"} /\ lk = 0
    /\ ReapOne
    /\ UNCHANGED <<pc, procVars, mySlot, reaped, procNum, lk, movedLive>>

RDegradedExit(a) ==
    /\ pc[a] = "degraded"
    /\ Leave(a)
    /\ UNCHANGED <<spawns, reaped, sPid, sWord, usage, procNum, lk, ghostVars>>

RStep(a) ==
    \/ RStart(a) \/ RClaim(a) \/ RReap(a) \/ RUnlock(a)
    \/ RUse(a) \/ RUWrite(a) \/ RXUsage(a) \/ RXPid(a)
    \/ RPReap(a) \/ RDegradedExit(a)

-----------------------------------------------------------------------------
(* C peers                                                                *)

CStart(a) ==
    /\ pc[a] = "c_start" /\ lk = 0
    /\ lk' = a
    /\ Goto(a, "c_claim")
    /\ UNCHANGED <<procVars, mySlot, reaped, sPid, sWord, usage, procNum, ghostVars>>

\* Reuse the slot with my pid (counters zeroed, unused[0] untouched), else
\* append at proc_num; exit(-1) when full (B30).
CClaim(a) ==
    /\ pc[a] = "c_claim"
    /\ LET mine == {i \in InRange : sPid[i] = pid[a]} IN
       IF mine # {} THEN
          /\ usage' = [usage EXCEPT ![Min(mine)] = {}]
          /\ mySlot' = [mySlot EXCEPT ![a] = Min(mine)]
          /\ Goto(a, "c_compact")
          /\ UNCHANGED <<pid, tag, sPid, procNum, lk>>
       ELSE IF procNum < SLOTS THEN
          /\ usage' = [usage EXCEPT ![procNum] = {}]
          /\ sPid' = [sPid EXCEPT ![procNum] = pid[a]]
          /\ procNum' = procNum + 1
          /\ mySlot' = [mySlot EXCEPT ![a] = procNum]
          /\ Goto(a, "c_compact")
          /\ UNCHANGED <<pid, tag, lk>>
       ELSE
          /\ lk' = 0
          /\ Leave(a)
          /\ UNCHANGED <<usage, sPid, procNum>>
    /\ UNCHANGED <<spawns, reaped, sWord, ghostVars>>

\* clear_proc_slot_nolock, one move per step, as many as it likes: the last
\* slot into a hole or into a slot whose pid is dead (pid-only check);
\* proc_num--.  The copy may or may not include unused[0]; the source keeps
\* its bytes.
CCompactStep(a) ==
    /\ pc[a] = "c_compact"
    /\ \/ /\ CCompact /\ procNum > 0
          /\ \E i \in InRange, copyWord \in BOOLEAN :
               /\ sPid[i] = 0 \/ ~PidLive(sPid[i])
               /\ LET l == procNum - 1 IN
                  /\ sPid'  = [sPid  EXCEPT ![i] = sPid[l]]
                  /\ usage' = [usage EXCEPT ![i] = usage[l]]
                  /\ sWord' = IF copyWord THEN [sWord EXCEPT ![i] = sWord[l]] ELSE sWord
                  /\ procNum' = l
                  /\ mySlot' = IF mySlot[a] = l THEN [mySlot EXCEPT ![a] = i] ELSE mySlot
          /\ UNCHANGED pc
       \/ /\ Goto(a, "c_unlock")
          /\ UNCHANGED <<sPid, usage, sWord, procNum, mySlot>>
    /\ UNCHANGED <<procVars, reaped, lk, ghostVars>>

CUnlock(a) ==
    /\ pc[a] = "c_unlock"
    /\ lk' = 0
    /\ Goto(a, "c_run")
    /\ UNCHANGED <<procVars, mySlot, reaped, sPid, sWord, usage, procNum, ghostVars>>

\* add_gpu_device_memory_usage, idealised: into the slot with my pid.
CUse(a) ==
    /\ pc[a] = "c_run"
    /\ \E i \in InRange : sPid[i] = pid[a] /\ usage' = [usage EXCEPT ![i] = @ \cup {Me(a)}]
    /\ UNCHANGED <<pc, procVars, mySlot, reaped, sPid, sWord, procNum, lk, ghostVars>>

\* exit_handler: the first slot (of all SLOTS) with my pid gets pid 0;
\* usage stays (B7).
CExit(a) ==
    /\ pc[a] = "c_run"
    /\ LET m == {i \in SlotIdx : sPid[i] = pid[a]} IN
       IF m = {} THEN UNCHANGED sPid ELSE sPid' = [sPid EXCEPT ![Min(m)] = 0]
    /\ Leave(a)
    /\ UNCHANGED <<spawns, reaped, sWord, usage, procNum, lk, ghostVars>>

CStep(a) == CStart(a) \/ CClaim(a) \/ CCompactStep(a) \/ CUnlock(a) \/ CUse(a) \/ CExit(a)

-----------------------------------------------------------------------------
(* Faults and new processes                                               *)

\* SIGKILL: the slot keeps pid, tag and usage; the lock is recovered.
\* (The pid, tag and slot index of a process that is gone are irrelevant
\* from then on; they are reset so that TLC merges equivalent states.)
Crash(a) ==
    /\ Live(a)
    /\ Goto(a, "dead")
    /\ lk' = IF lk = a THEN 0 ELSE lk
    /\ pid' = [pid EXCEPT ![a] = 0]
    /\ tag' = [tag EXCEPT ![a] = 0]
    /\ mySlot' = [mySlot EXCEPT ![a] = NoSlot]
    /\ UNCHANGED <<spawns, reaped, sPid, sWord, usage, procNum, ghostVars>>

Respawn(a) ==
    /\ pc[a] \in {"dead", "gone"} /\ spawns < MaxSpawns
    /\ a \in RActors \/ CPidReuse
    /\ \E p \in RespawnPids \ {pid[x] : x \in {y \in Actors : Live(y)}} :
          pid' = [pid EXCEPT ![a] = p]
    /\ tag' = [tag EXCEPT ![a] = NA + spawns + 1]
    /\ spawns' = spawns + 1
    /\ mySlot' = [mySlot EXCEPT ![a] = NoSlot]
    /\ Goto(a, IF a \in RActors THEN "start" ELSE "c_start")
    /\ UNCHANGED <<reaped, sPid, sWord, usage, procNum, lk, ghostVars>>

Next ==
    \/ \E a \in RActors : RStep(a)
    \/ \E a \in CActors : CStep(a)
    \/ \E a \in Actors : Crash(a) \/ Respawn(a)

\* Weak fairness for each process and for its periodic reaper.
Spec == /\ Init /\ [][Next]_vars
        /\ \A a \in RActors : WF_vars(RStep(a)) /\ WF_vars(RPReap(a))
        /\ \A a \in CActors : WF_vars(CStep(a))

-----------------------------------------------------------------------------
(* Properties                                                             *)

TypeOK ==
    /\ pc \in [Actors -> {"start", "claim", "reap", "unlock", "run",
                          "u_write", "x_usage", "x_pid", "degraded",
                          "c_start", "c_claim", "c_compact", "c_unlock", "c_run",
                          "gone", "dead"}]
    /\ pid \in [Actors -> Pids \cup {0}]
    /\ tag \in [Actors -> Tags \cup {0}]
    /\ mySlot \in [Actors -> SlotIdx \cup {NoSlot}]
    /\ sPid \in [SlotIdx -> Pids \cup {0}]
    /\ sWord \in [SlotIdx -> Words]
    /\ usage \in [SlotIdx -> SUBSET Incs]
    /\ procNum \in 0..SLOTS
    /\ lk \in Actors \cup {0}

\* No pid appears twice in [0, proc_num): C peers' and our own pid scans
\* (exit handler, slow path, re-find) find the right slot.
PidsUnique ==
    \A i, j \in InRange : (i # j /\ sPid[i] # 0) => sPid[i] # sPid[j]

\* No two live processes of ours own (believe they own) one slot.
NoSharedSlot ==
    \A a, b \in RActors : (a # b /\ HasSlot(a) /\ HasSlot(b)) => mySlot[a] # mySlot[b]

\* A live process's slot is never moved by one of our processes.
OursNeverMove == ~movedLive

\* Reaping never clears the slot of a live process.
NoLiveSlotReaped == ~reapedLive

\* Counted usage sits only in slots of live or not-yet-reaped processes:
\* a hole (pid 0) in [0, proc_num) never carries usage.
HoleEmpty == \A i \in InRange : sPid[i] = 0 => usage[i] = {}

\* Usage in a slot was added by incarnations with that slot's pid only.
UsageAttribution ==
    \A i \in InRange : sPid[i] # 0 => \A u \in usage[i] : u[1] = sPid[i]

\* Liveness: usage left by a dead (or C-exited) process is eventually
\* cleared, as long as some process of ours keeps running.
DeadUsage(i) == i < procNum /\ usage[i] # {} /\ (sPid[i] = 0 \/ ~SlotOwnerLive(i))
SomeReaper == \E a \in RActors : pc[a] \in {"run", "u_write"}
DeadUsageReaped == \A i \in SlotIdx : DeadUsage(i) ~> (~DeadUsage(i) \/ ~SomeReaper)

=============================================================================

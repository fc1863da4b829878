------------------------------ MODULE OwnerLock ------------------------------
(***************************************************************************)
(* The owner lock of the shared region, as core/src/lock.rs implements it: *)
(* the process-shared semaphore `sem` (initial value 1; the kernel does   *)
(* NOT give a dead holder's token back) plus the 64-bit word `owner_pid`  *)
(* (pid in the low 32 bits, start tag above; C peers write tag 0), and    *)
(* the "window": a shared fcntl read lock on a byte range beyond the      *)
(* region, which the kernel drops when its holder dies.  Our processes    *)
(* hold it wherever `sem` and `owner_pid` may disagree; C peers never.    *)
(*                                                                         *)
(* Ours, lock::acquire (pc values in brackets):                           *)
(*   try_take:  [try] window_enter  [tt_sem] sem_wait(sem, 0) (try-wait)  *)
(*              acquired: [tt_store] owner := me  [tt_ok] window_exit     *)
(*              -> [cs];  timed out: [tt_fail] window_exit -> [obs]       *)
(*   [obs]  load owner_pid (and, if it is 0, sem_value):                  *)
(*     owner = MARKER: reset the orphan timer; clear_dead_marker:         *)
(*       [rc_enter] window_enter [rc_win] nobody else in the window?      *)
(*       [rc_cas] CAS(owner, MARKER, 0), NO post; [rc_exit] window_exit   *)
(*     other owner # 0: reset the orphan timer; liveness(owner) = Dead -> *)
(*       recover_dead_owner: [rc_enter] window_enter [rc_cas] CAS(owner,  *)
(*       o, 0), the winner [rc_post] sem_post; [rc_exit] window_exit      *)
(*     owner = 0 and sem = 0: the orphan timer runs; once it has run a    *)
(*       whole grace period -> take_over_lost_token:                      *)
(*       [to_enter] window_enter  [to_sem] sem_value = 0?                 *)
(*       [to_win] window_held_by_other?  [to_cas] CAS(owner, 0, MARKER)   *)
(*       then re-validate: [rv_win1] nobody else in the window,           *)
(*       [rv_sem] sem_value = 0, [rv_win2] nobody else in the window;     *)
(*       all hold: [rv_commit] CAS(owner, MARKER, me), success -> holds;  *)
(*       a check fails: [undo] CAS(owner, MARKER, 0);                     *)
(*       [to_ok] / [to_fail] window_exit                                  *)
(*                                                                         *)
(* The marker MARKER is one constant: pid 1 (InitPid) in the low 32 bits, *)
(* so C peers' proc_alive(1) says alive and they never recover or post   *)
(* for it, and all ones above (never a real start tag).  It names no     *)
(* creator.  Its creator holds the window from before the CAS that sets  *)
(* it until after the CAS that replaces it, and the kernel drops a dead  *)
(* process's window, so a marker is dead iff nobody else holds the       *)
(* window; only a dead creator's marker can be cleared, and it carried   *)
(* no token, so clearing it posts nothing.                               *)
(*     owner = 0 and sem > 0: reset the orphan timer                      *)
(*     then back off and retry ([try])                                    *)
(* Ours, OwnerGuard::drop: [cs] window_enter  [rl_cas] CAS(owner, me, 0); *)
(*   only if it succeeded [rl_post] sem_post; [rl_exit] window_exit.      *)
(*   After a release the process competes again ([try]).                  *)
(*                                                                         *)
(* The orphan timer.  The grace period matters only against C peers,      *)
(* whose gaps have no window; with the grace assumption below, safety     *)
(* does not depend on its length, and any behaviour with a longer grace   *)
(* (more sightings of owner = 0, sem = 0 before the takeover) is, minus   *)
(* the extra sightings, a behaviour with a grace of two sightings.  So    *)
(* the timer is a flag: set at the first sighting of owner = 0, sem = 0, *)
(* cleared by a sighting of owner # 0 or sem > 0; a sighting while it is  *)
(* set starts the takeover.  Liveness of the owner is judged when        *)
(* owner_pid is read (a tagged identity, once dead, stays dead).          *)
(*                                                                         *)
(* C peers (HAMi-core lock_shrreg / unlock_shrreg at HEAD): sem_timedwait *)
(* then owner := pid; on timeout, owner # 0 and proc_alive(pid) says dead *)
(* -> CAS(owner, o, 0), the winner posts; owner = 0 -> keep waiting (the  *)
(* 310 s exit(-1) is a crash).  unlock: owner := 0, then sem_post, with   *)
(* no ownership check.                                                    *)
(*                                                                         *)
(* GRACE ASSUMPTION: C peers have three unprotected gaps (sem_wait ->     *)
(* owner store; owner clear -> sem_post; recovery CAS -> sem_post).  A C  *)
(* peer never STALLS in one of them longer than our orphan grace period   *)
(* (1 s by default), but it may DIE in one.  Modelled as: each gap is one *)
(* atomic step, and CrashInGap dies inside it.  CStall = TRUE drops the   *)
(* assumption (OwnerLock_wit_cstall: MutualExclusion fails).              *)
(*                                                                         *)
(* Not modelled: the acquire deadline (LockError::Timeout: the caller     *)
(* just tries again later, which [try] covers); back-off lengths; threads *)
(* (the owner-lock calls of one process are serialised by the caller).   *)
(*                                                                         *)
(* Bugs planted by Bug (each has a witness config OwnerLock_wit_*.cfg):   *)
(*   post_no_cas      recovery: owner := 0 and post, no CAS               *)
(*   pid_only         identities are pids (no start tag): B13/B14         *)
(*   c_unlock         release in the C order: owner := 0, sem_post,       *)
(*                    unconditional, no window                            *)
(*   release_no_window  release CAS + post outside the window             *)
(*   post_on_failed_cas release posts although its CAS failed (B15-like)  *)
(*   no_window_check  takeover ignores the window (checks and re-checks)  *)
(*   no_revalidate    takeover holds right after its CAS, no re-checks    *)
(*   trytake_no_window try_take outside the window (B12's gap unseen)     *)
(*   no_marker        the takeover CASes its own identity (0 -> me)      *)
(*                    before its re-checks: lock.rs before the marker;    *)
(*                    a taker dying before its undo leaves a "dead owner" *)
(*                    that is recovered with a post (finding 1)           *)
(*   marker_no_window a marker is cleared without checking the window     *)
(*   marker_c_dead    the marker's pid half is no live pid, so C peers    *)
(*                    judge it dead (recover it and post)                 *)
(***************************************************************************)
EXTENDS Naturals, FiniteSets, TLC

CONSTANTS
    RActors,      \* our processes; numbers, also their initial pids and tags
    CActors,      \* C HAMi-core peers; numbers disjoint from RActors
    RespawnPids,  \* pids a respawned process of ours may get (PID reuse)
    MaxSpawns,    \* total number of respawns in a behaviour
    Misjudge,     \* TRUE: liveness may call a LIVE tagged owner dead (B16)
    CStall,       \* TRUE: C peers may stall inside their unprotected gaps
    Bug           \* "none" or a planted bug (BugNames)

BugNames == {"none", "post_no_cas", "pid_only", "c_unlock", "release_no_window",
             "post_on_failed_cas", "no_window_check", "no_revalidate",
             "trytake_no_window", "no_marker", "marker_no_window",
             "marker_c_dead"}

ASSUME Bug \in BugNames
ASSUME RActors \cap CActors = {}

Actors  == RActors \cup CActors
NoOwner == <<0, 0>>
NA      == Cardinality(Actors)
Pids    == Actors \cup RespawnPids
Tags    == 0..(NA + MaxSpawns)
\* TAKEOVER_MARKER: the takeover CASes it first and its real identity only
\* after the re-checks.  Low half InitPid (1 in the code; a number outside
\* Pids here), high half all ones (MarkerTag: no start tag is ever that).
\* Bug marker_c_dead: its low half is a pid that no process ever has.
InitPid   == 1000
NoPid     == 2000
MarkerTag == 999
Marker  == <<IF Bug = "marker_c_dead" THEN NoPid ELSE InitPid, MarkerTag>>
IsMarker(o) == o = Marker
Ids     == {NoOwner, Marker} \cup (Pids \X Tags)

VARIABLES
    pc,      \* pc[a]: control state
    pid,     \* pid[a]: current pid of actor a (changes on respawn)
    tag,     \* tag[a]: start tag of the current incarnation (0 for C peers)
    seen,    \* seen[a]: the dead owner a read before its recovery CAS
    orphan,  \* orphan[a]: a's orphan timer is running
    sem,     \* the semaphore's value
    owner,   \* owner_pid as <<pid, tag>>; NoOwner = 0
    window,  \* processes of ours holding the window (a shared read lock)
    spawns   \* respawns so far

vars == <<pc, pid, tag, seen, orphan, sem, owner, window, spawns>>

RStates == {"try", "tt_sem", "tt_store", "tt_ok", "tt_fail", "obs",
            "rc_enter", "rc_win", "rc_cas", "rc_post", "rc_exit",
            "to_enter", "to_sem", "to_win", "to_cas", "rv_win1", "rv_sem",
            "rv_win2", "rv_own", "rv_commit", "undo", "to_ok", "to_fail",
            "cs", "rl_cas", "rl_post", "rl_exit", "dead"}
CStates == {"try", "c_store", "c_judge", "c_rcas", "cs", "c_rel", "dead"}

Live(a)   == pc[a] # "dead"
MyId(a)   == IF a \in CActors \/ Bug = "pid_only" THEN <<pid[a], 0>>
                                                 ELSE <<pid[a], tag[a]>>
\* What the takeover CASes into owner_pid before its re-checks.
TakeoverId(a) == IF Bug = "no_marker" THEN MyId(a) ELSE Marker
PidLive(p) == \E x \in Actors : Live(x) /\ pid[x] = p
IncLive(o) == \E x \in Actors : Live(x) /\ pid[x] = o[1] /\ tag[x] = o[2]

\* Platform::liveness: tag 0 (a C peer's store) is checked by pid only; a
\* tagged identity is dead unless a live process has that pid AND tag.
\* (The marker is not judged here: clear_dead_marker checks the window.)
RJudgesDead(o) ==
    IF o[2] = 0 THEN ~PidLive(o[1])
    ELSE ~IncLive(o)
\* HAMi-core's proc_alive(): the low 32 bits only; InitPid is alive.
CJudgesDead(o) == o[1] # InitPid /\ ~PidLive(o[1])
\* B16 (/proc unreadable, other PID namespace): only for tagged owners of
\* ours; see OwnerLockMisjudge.cfg.
MayMisjudge(o) == Misjudge /\ o[2] # 0 /\ ~IsMarker(o)

Others(a) == window \ {a}
UsesWindow(a, what) ==
    ~(  (what = "trytake" /\ Bug = "trytake_no_window")
     \/ (what = "release" /\ Bug \in {"c_unlock", "release_no_window"}))
Enter(a, what) == window' = IF UsesWindow(a, what) THEN window \cup {a} ELSE window
Exit(a) == window' = window \ {a}

Goto(a, s) == pc' = [pc EXCEPT ![a] = s]

-----------------------------------------------------------------------------
(* Init: a freshly initialised region (sem 1, owner_pid 0).               *)
Init ==
    /\ pc     = [a \in Actors |-> "try"]
    /\ pid    = [a \in Actors |-> a]
    /\ tag    = [a \in Actors |-> IF a \in RActors THEN a ELSE 0]
    /\ seen   = [a \in Actors |-> NoOwner]
    /\ orphan = [a \in Actors |-> FALSE]
    /\ sem    = 1
    /\ owner  = NoOwner
    /\ window = {}
    /\ spawns = 0

-----------------------------------------------------------------------------
(* Ours: lock::try_take                                                   *)

RTry(a) ==
    /\ pc[a] = "try"
    /\ Enter(a, "trytake")
    /\ Goto(a, "tt_sem")
    /\ UNCHANGED <<pid, tag, seen, orphan, sem, owner, spawns>>

RTtSem(a) ==
    /\ pc[a] = "tt_sem"
    /\ IF sem > 0 THEN sem' = sem - 1 /\ Goto(a, "tt_store")
                  ELSE sem' = sem     /\ Goto(a, "tt_fail")
    /\ UNCHANGED <<pid, tag, seen, orphan, owner, window, spawns>>

RTtStore(a) ==
    /\ pc[a] = "tt_store"
    /\ owner' = MyId(a)
    /\ Goto(a, "tt_ok")
    /\ UNCHANGED <<pid, tag, seen, orphan, sem, window, spawns>>

RTtOk(a) ==
    /\ pc[a] = "tt_ok"
    /\ Exit(a)
    /\ orphan' = [orphan EXCEPT ![a] = FALSE]
    /\ Goto(a, "cs")
    /\ UNCHANGED <<pid, tag, seen, sem, owner, spawns>>

RTtFail(a) ==
    /\ pc[a] = "tt_fail"
    /\ Exit(a)
    /\ Goto(a, "obs")
    /\ UNCHANGED <<pid, tag, seen, orphan, sem, owner, spawns>>

(* Ours: the rest of one round of lock::acquire                           *)
RObs(a) ==
    /\ pc[a] = "obs"
    /\ IF owner # NoOwner THEN
          /\ orphan' = [orphan EXCEPT ![a] = FALSE]
          /\ IF IsMarker(owner) \/ RJudgesDead(owner) \/ MayMisjudge(owner)
                THEN seen' = [seen EXCEPT ![a] = owner] /\ Goto(a, "rc_enter")
                ELSE seen' = seen /\ Goto(a, "try")
       ELSE IF sem = 0 THEN
          /\ seen' = seen
          /\ IF orphan[a]
                THEN orphan' = [orphan EXCEPT ![a] = FALSE] /\ Goto(a, "to_enter")
                ELSE orphan' = [orphan EXCEPT ![a] = TRUE]  /\ Goto(a, "try")
       ELSE
          /\ orphan' = [orphan EXCEPT ![a] = FALSE]
          /\ seen' = seen
          /\ Goto(a, "try")
    /\ UNCHANGED <<pid, tag, sem, owner, window, spawns>>

(* Ours: lock::recover_dead_owner and clear_dead_marker                   *)
RRcEnter(a) ==
    /\ pc[a] = "rc_enter"
    /\ Enter(a, "recover")
    /\ Goto(a, IF IsMarker(seen[a]) THEN "rc_win" ELSE "rc_cas")
    /\ UNCHANGED <<pid, tag, seen, orphan, sem, owner, spawns>>

\* clear_dead_marker: the marker is dead iff nobody else holds the window.
\* Bug marker_no_window: clear it without looking.
RRcWin(a) ==
    /\ pc[a] = "rc_win"
    /\ IF Others(a) = {} \/ Bug = "marker_no_window"
          THEN Goto(a, "rc_cas") /\ seen' = seen
          ELSE Goto(a, "rc_exit") /\ seen' = [seen EXCEPT ![a] = NoOwner]
    /\ UNCHANGED <<pid, tag, orphan, sem, owner, window, spawns>>

\* CAS(owner, o, 0); the winner posts, unless o was a (dead) marker, which
\* held no token.  Bug post_no_cas: a plain store of 0, and always post.
RRcCas(a) ==
    /\ pc[a] = "rc_cas"
    /\ IF Bug = "post_no_cas" \/ owner = seen[a]
          THEN owner' = NoOwner
               /\ Goto(a, IF IsMarker(seen[a]) THEN "rc_exit" ELSE "rc_post")
          ELSE owner' = owner /\ Goto(a, "rc_exit")
    /\ seen' = [seen EXCEPT ![a] = NoOwner]
    /\ UNCHANGED <<pid, tag, orphan, sem, window, spawns>>

RRcPost(a) ==
    /\ pc[a] = "rc_post"
    /\ sem' = sem + 1
    /\ Goto(a, "rc_exit")
    /\ UNCHANGED <<pid, tag, seen, orphan, owner, window, spawns>>

RRcExit(a) ==
    /\ pc[a] = "rc_exit"
    /\ Exit(a)
    /\ Goto(a, "try")
    /\ UNCHANGED <<pid, tag, seen, orphan, sem, owner, spawns>>

(* Ours: lock::take_over_lost_token                                       *)
RToEnter(a) ==
    /\ pc[a] = "to_enter"
    /\ Enter(a, "takeover")
    /\ Goto(a, "to_sem")
    /\ UNCHANGED <<pid, tag, seen, orphan, sem, owner, spawns>>

WinEmpty(a) == Others(a) = {} \/ Bug = "no_window_check"

\* token_looks_lost: sem_value = 0, then !window_held_by_other.
RToSem(a) ==
    /\ pc[a] = "to_sem"
    /\ Goto(a, IF sem = 0 THEN "to_win" ELSE "to_fail")
    /\ UNCHANGED <<pid, tag, seen, orphan, sem, owner, window, spawns>>

RToWin(a) ==
    /\ pc[a] = "to_win"
    /\ Goto(a, IF WinEmpty(a) THEN "to_cas" ELSE "to_fail")
    /\ UNCHANGED <<pid, tag, seen, orphan, sem, owner, window, spawns>>

RToCas(a) ==
    /\ pc[a] = "to_cas"
    /\ IF owner = NoOwner
          THEN owner' = TakeoverId(a)
               /\ Goto(a, IF Bug = "no_revalidate" THEN "rv_commit" ELSE "rv_win1")
          ELSE owner' = owner /\ Goto(a, "to_fail")
    /\ UNCHANGED <<pid, tag, seen, orphan, sem, window, spawns>>

RRvWin1(a) ==
    /\ pc[a] = "rv_win1"
    /\ Goto(a, IF WinEmpty(a) THEN "rv_sem" ELSE "undo")
    /\ UNCHANGED <<pid, tag, seen, orphan, sem, owner, window, spawns>>

RRvSem(a) ==
    /\ pc[a] = "rv_sem"
    /\ Goto(a, IF sem = 0 THEN "rv_win2" ELSE "undo")
    /\ UNCHANGED <<pid, tag, seen, orphan, sem, owner, window, spawns>>

RRvWin2(a) ==
    /\ pc[a] = "rv_win2"
    /\ Goto(a, IF ~WinEmpty(a) THEN "undo"
               ELSE IF Bug = "no_marker" THEN "rv_own" ELSE "rv_commit")
    /\ UNCHANGED <<pid, tag, seen, orphan, sem, owner, window, spawns>>

\* (no_marker only: lock.rs before the marker) owner_pid still me?
RRvOwn(a) ==
    /\ pc[a] = "rv_own"
    /\ Goto(a, IF owner = MyId(a) THEN "to_ok" ELSE "undo")
    /\ UNCHANGED <<pid, tag, seen, orphan, sem, owner, window, spawns>>

\* CAS(owner, MARKER, me); it fails only if the marker was cleared.
RRvCommit(a) ==
    /\ pc[a] = "rv_commit"
    /\ IF owner = TakeoverId(a) THEN owner' = MyId(a) /\ Goto(a, "to_ok")
                                ELSE owner' = owner   /\ Goto(a, "undo")
    /\ UNCHANGED <<pid, tag, seen, orphan, sem, window, spawns>>

\* CAS(owner, MARKER, 0) (no_marker: CAS(owner, me, 0)).
RUndo(a) ==
    /\ pc[a] = "undo"
    /\ owner' = IF owner = TakeoverId(a) THEN NoOwner ELSE owner
    /\ Goto(a, "to_fail")
    /\ UNCHANGED <<pid, tag, seen, orphan, sem, window, spawns>>

RToOk(a) ==
    /\ pc[a] = "to_ok"
    /\ Exit(a)
    /\ Goto(a, "cs")
    /\ UNCHANGED <<pid, tag, seen, orphan, sem, owner, spawns>>

RToFail(a) ==
    /\ pc[a] = "to_fail"
    /\ Exit(a)
    /\ Goto(a, "try")
    /\ UNCHANGED <<pid, tag, seen, orphan, sem, owner, spawns>>

-----------------------------------------------------------------------------
(* Ours: OwnerGuard::drop                                                 *)

RCs(a) ==
    /\ pc[a] = "cs"
    /\ Enter(a, "release")
    /\ Goto(a, "rl_cas")
    /\ UNCHANGED <<pid, tag, seen, orphan, sem, owner, spawns>>

\* CAS(owner, me, 0); post only if it succeeded (else Problem::LockStolen).
\* Bug post_on_failed_cas: post anyway.  Bug c_unlock: owner := 0, post.
RRlCas(a) ==
    /\ pc[a] = "rl_cas"
    /\ IF owner = MyId(a) \/ Bug = "c_unlock"
          THEN owner' = NoOwner /\ Goto(a, "rl_post")
          ELSE owner' = owner
               /\ Goto(a, IF Bug = "post_on_failed_cas" THEN "rl_post" ELSE "rl_exit")
    /\ UNCHANGED <<pid, tag, seen, orphan, sem, window, spawns>>

RRlPost(a) ==
    /\ pc[a] = "rl_post"
    /\ sem' = sem + 1
    /\ Goto(a, "rl_exit")
    /\ UNCHANGED <<pid, tag, seen, orphan, owner, window, spawns>>

RRlExit(a) ==
    /\ pc[a] = "rl_exit"
    /\ Exit(a)
    /\ Goto(a, "try")
    /\ UNCHANGED <<pid, tag, seen, orphan, sem, owner, spawns>>

RStep(a) ==
    \/ RTry(a) \/ RTtSem(a) \/ RTtStore(a) \/ RTtOk(a) \/ RTtFail(a) \/ RObs(a)
    \/ RRcEnter(a) \/ RRcWin(a) \/ RRcCas(a) \/ RRcPost(a) \/ RRcExit(a)
    \/ RToEnter(a) \/ RToSem(a) \/ RToWin(a) \/ RToCas(a)
    \/ RRvWin1(a) \/ RRvSem(a) \/ RRvWin2(a) \/ RRvOwn(a) \/ RRvCommit(a)
    \/ RUndo(a) \/ RToOk(a) \/ RToFail(a)
    \/ RCs(a) \/ RRlCas(a) \/ RRlPost(a) \/ RRlExit(a)

-----------------------------------------------------------------------------
(* C peers: HAMi-core HEAD lock_shrreg / unlock_shrreg                    *)

CTry(a) ==
    /\ pc[a] = "try"
    /\ IF sem > 0
          THEN /\ sem' = sem - 1
               /\ IF CStall THEN owner' = owner   /\ Goto(a, "c_store")
                            ELSE owner' = MyId(a) /\ Goto(a, "cs")
          ELSE sem' = sem /\ owner' = owner /\ Goto(a, "c_judge")
    /\ UNCHANGED <<pid, tag, seen, orphan, window, spawns>>

CStore(a) ==
    /\ pc[a] = "c_store"
    /\ owner' = MyId(a)
    /\ Goto(a, "cs")
    /\ UNCHANGED <<pid, tag, seen, orphan, sem, window, spawns>>

CJudge(a) ==
    /\ pc[a] = "c_judge"
    /\ IF owner # NoOwner /\ (CJudgesDead(owner) \/ MayMisjudge(owner))
          THEN seen' = [seen EXCEPT ![a] = owner] /\ Goto(a, "c_rcas")
          ELSE seen' = seen /\ Goto(a, "try")
    /\ UNCHANGED <<pid, tag, orphan, sem, owner, window, spawns>>

\* CAS(owner, o, 0), the winner posts (one step: grace assumption).
CRcas(a) ==
    /\ pc[a] = "c_rcas"
    /\ IF owner = seen[a] THEN owner' = NoOwner /\ sem' = sem + 1
                          ELSE UNCHANGED <<owner, sem>>
    /\ seen' = [seen EXCEPT ![a] = NoOwner]
    /\ Goto(a, "try")
    /\ UNCHANGED <<pid, tag, orphan, window, spawns>>

\* unlock_shrreg: owner := 0 (no ownership check), then sem_post.
CCs(a) ==
    /\ pc[a] = "cs"
    /\ owner' = NoOwner
    /\ IF CStall THEN sem' = sem     /\ Goto(a, "c_rel")
                 ELSE sem' = sem + 1 /\ Goto(a, "try")
    /\ UNCHANGED <<pid, tag, seen, orphan, window, spawns>>

CRel(a) ==
    /\ pc[a] = "c_rel"
    /\ sem' = sem + 1
    /\ Goto(a, "try")
    /\ UNCHANGED <<pid, tag, seen, orphan, owner, window, spawns>>

CStep(a) == CTry(a) \/ CStore(a) \/ CJudge(a) \/ CRcas(a) \/ CCs(a) \/ CRel(a)

-----------------------------------------------------------------------------
(* Faults                                                                 *)

\* SIGKILL at any step: the kernel drops the window; sem and owner_pid
\* keep what they hold.
Crash(a) ==
    /\ Live(a)
    /\ pc'     = [pc EXCEPT ![a] = "dead"]
    /\ window' = window \ {a}
    /\ seen'   = [seen EXCEPT ![a] = NoOwner]
    /\ orphan' = [orphan EXCEPT ![a] = FALSE]
    /\ UNCHANGED <<pid, tag, sem, owner, spawns>>

\* A C peer dies INSIDE one of its (otherwise atomic) gaps.
CrashInGap(a) ==
    /\ ~CStall
    /\ \/ pc[a] = "try"    /\ sem > 0 /\ sem' = sem - 1 /\ owner' = owner  \* B12
       \/ pc[a] = "cs"     /\ owner' = NoOwner /\ sem' = sem              \* B12
       \/ pc[a] = "c_rcas" /\ owner = seen[a] /\ owner' = NoOwner /\ sem' = sem
    /\ pc'   = [pc EXCEPT ![a] = "dead"]
    /\ seen' = [seen EXCEPT ![a] = NoOwner]
    /\ UNCHANGED <<pid, tag, orphan, window, spawns>>

\* A new process of ours starts with a pid no live process has, possibly a
\* dead one's (PID reuse), always with a new start tag.
Respawn(a) ==
    /\ a \in RActors /\ pc[a] = "dead" /\ spawns < MaxSpawns
    /\ \E p \in RespawnPids \ {pid[x] : x \in {y \in Actors : Live(y)}} :
          pid' = [pid EXCEPT ![a] = p]
    /\ tag'    = [tag EXCEPT ![a] = NA + spawns + 1]
    /\ spawns' = spawns + 1
    /\ Goto(a, "try")
    /\ UNCHANGED <<seen, orphan, sem, owner, window>>

Next ==
    \/ \E a \in RActors : RStep(a)
    \/ \E a \in CActors : CStep(a) \/ CrashInGap(a)
    \/ \E a \in Actors  : Crash(a) \/ Respawn(a)

\* Weak fairness of every process's own steps; crashes and respawns are
\* never forced.
Spec == /\ Init /\ [][Next]_vars
        /\ \A a \in RActors : WF_vars(RStep(a))
        /\ \A a \in CActors : WF_vars(CStep(a))

-----------------------------------------------------------------------------
(* Properties                                                             *)

TypeOK ==
    /\ pc \in [Actors -> RStates \cup CStates]
    /\ pid \in [Actors -> Pids]
    /\ tag \in [Actors -> Tags]
    /\ seen \in [Actors -> Ids]
    /\ orphan \in [Actors -> BOOLEAN]
    /\ sem \in Nat
    /\ owner \in Ids
    /\ window \subseteq RActors
    /\ spawns \in 0..MaxSpawns

\* "Believes it holds the lock": acquire returned, release's CAS not yet done.
InCS(a) == pc[a] \in {"cs", "rl_cas"}

\* Mutual exclusion: at most one live process believes it holds the lock.
MutualExclusion == \A a, b \in Actors : (InCS(a) /\ InCS(b)) => a = b

\* The semaphore never counts more than one token.
SemBound == sem <= 1

\* Holding the token (taken, inherited, or being given back).
HoldsToken(a) ==
    \/ pc[a] \in {"tt_store", "tt_ok", "cs", "rc_post", "rl_post", "c_store", "c_rel"}
    \/ pc[a] = "rl_cas" /\ owner = MyId(a)
    \/ pc[a] = "to_ok"

\* No token appears from nowhere: tokens in sem plus tokens held <= 1.
NoDoublePost == sem + Cardinality({a \in Actors : HoldsToken(a)}) <= 1

\* Liveness.  A process of ours is trying to take the lock.
Trying(a) == a \in RActors /\ pc[a] \notin {"cs", "rl_cas", "rl_post", "rl_exit", "dead"}
SomeTrying == \E a \in RActors : Trying(a)

\* owner_pid names no live process that believes it owns it: its writer
\* died (or, with Bug = pid_only, its pid now belongs to a newer process,
\* which is exactly why the reused pid hides it).  A marker is owned by a
\* live taker between its CAS and its commit or undo.
HoldStates  == {"tt_ok", "cs", "rl_cas", "to_ok"}
TakeStates  == {"rv_win1", "rv_sem", "rv_win2", "rv_own", "rv_commit", "undo"}
OwnerDead ==
    /\ owner # NoOwner
    /\ ~\E x \in Actors : /\ Live(x)
                         /\ \/ pc[x] \in HoldStates  /\ owner = MyId(x)
                            \/ pc[x] \in TakeStates /\ owner = TakeoverId(x)

\* A dead owner (a real identity: its holder died) is eventually recovered
\* while a process of ours tries.
DeadOwnerRecovered ==
    (OwnerDead /\ ~IsMarker(owner) /\ SomeTrying) ~> (~OwnerDead \/ ~SomeTrying)

\* A dead taker's marker is eventually cleared while a process of ours
\* tries.  This does NOT hold under weak fairness alone (OwnerLock_lim_
\* marker_livelock): two waiters can keep seeing each other's try_take in
\* the window forever, as with the lost-token takeover (Progress).
DeadMarkerCleared ==
    (OwnerDead /\ IsMarker(owner) /\ SomeTrying) ~> (~OwnerDead \/ ~SomeTrying)

\* Nobody clears a live taker's marker: between its CAS and its commit the
\* marker moves only by the taker itself (or by a try_take that got a
\* posted token, which makes the commit CAS fail).  This is what the
\* window check of clear_dead_marker is for; mutual exclusion does not
\* depend on it (OwnerLock_wit_marker_no_window).
LiveTaker == \E x \in RActors : Live(x) /\ pc[x] \in {"rv_win1", "rv_sem", "rv_win2", "rv_commit"}
LiveMarkerKept == [][(owner = Marker /\ owner' = NoOwner) => ~LiveTaker]_vars

\* Stronger: someone eventually gets the lock (this covers a lost token).
SomeoneInCS == \E a \in Actors : pc[a] = "cs"
Progress == SomeTrying ~> (SomeoneInCS \/ ~SomeTrying)

=============================================================================

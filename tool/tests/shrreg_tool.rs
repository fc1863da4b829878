//! shrreg-tool, run as a binary against region images built here byte by byte (the offsets are
//! HAMi-core v1.2's, pinned in core/src/layout.rs), healthy and corrupted; and the report logic
//! of `hami_tool::inspect` on small in-memory regions.

use std::fs;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hami_shm::layout::{Region, SharedRegion, MAGIC};
use hami_shm::platform::{Liveness, ProcId};
use hami_shm::validate::Verdict;
use hami_tool::inspect::{self, FileInfo, Finding};

/// Byte offsets of the v1.2 region (x86_64, glibc), as in the reference and `mod pinned`.
mod off {
    pub const SIZE: usize = 2_008_952;
    pub const FLAG: usize = 0;
    pub const MAJOR: usize = 4;
    pub const MINOR: usize = 8;
    pub const OWNER: usize = 16;
    pub const SEM: usize = 24;
    pub const DEVICE_NUM: usize = 56;
    pub const UUIDS: usize = 64;
    pub const LIMIT: usize = 1600;
    pub const SM_LIMIT: usize = 1728;
    pub const PROCS: usize = 1856;
    pub const SLOT: usize = 1960;
    pub const PROC_NUM: usize = 2_008_896;
    pub const UTIL_SWITCH: usize = 2_008_900;
    pub const RECENT_KERNEL: usize = 2_008_904;
    pub const PRIORITY: usize = 2_008_908;
    pub const POSTINIT: usize = 2_008_920;
    /// Within a slot.
    pub const PID: usize = 0;
    pub const HOSTPID: usize = 4;
    pub const USED: usize = 8;
    pub const MEM: usize = 64;
    pub const CONTEXT: usize = 0;
    pub const MODULE: usize = 8;
    pub const DATA: usize = 16;
    pub const TOTAL: usize = 32;
    pub const STATUS: usize = 1928;
    pub const SEQLOCK: usize = 1936;
    pub const TAG: usize = 1944;
    /// glibc sem_t: value in the low 32 bits of word 0, `private` at +8.
    pub const SEM_PRIVATE: usize = 8;
}

const SHARED: u32 = 0x80;
const MIB: u64 = 1 << 20;

#[test]
fn offsets_match_the_library() {
    assert_eq!(SharedRegion::SIZE, off::SIZE);
}

/// A region image in memory.
struct Image(Vec<u8>);

impl Image {
    fn zeroed(len: usize) -> Image {
        Image(vec![0; len])
    }

    fn u32(&mut self, at: usize, v: u32) -> &mut Self {
        self.0[at..at + 4].copy_from_slice(&v.to_le_bytes());
        self
    }

    fn u64(&mut self, at: usize, v: u64) -> &mut Self {
        self.0[at..at + 8].copy_from_slice(&v.to_le_bytes());
        self
    }

    fn get_u32(&self, at: usize) -> u32 {
        u32::from_le_bytes(self.0[at..at + 4].try_into().unwrap())
    }

    fn get_u64(&self, at: usize) -> u64 {
        u64::from_le_bytes(self.0[at..at + 8].try_into().unwrap())
    }

    /// An initialised region of `major.minor`, sem ready, no slots, file `SIZE + 1` bytes.
    fn initialised(minor: u32) -> Image {
        let mut img = Image::zeroed(off::SIZE + 1);
        img.u32(off::FLAG, MAGIC as u32)
            .u32(off::MAJOR, 1)
            .u32(off::MINOR, minor)
            .u64(off::SEM, 1)
            .u32(off::SEM + off::SEM_PRIVATE, SHARED)
            .u64(off::DEVICE_NUM, 1)
            .u64(off::SM_LIMIT, 100)
            .u32(off::UTIL_SWITCH, 1)
            .u32(off::RECENT_KERNEL, 2)
            .u32(off::PRIORITY, 1);
        let uuid = b"GPU-8a3b1c2d-0000-1111-2222-333344445555";
        img.0[off::UUIDS..off::UUIDS + uuid.len()].copy_from_slice(uuid);
        if minor >= 2 {
            img.u64(off::POSTINIT, 1)
                .u32(off::POSTINIT + off::SEM_PRIVATE, SHARED);
        }
        img
    }

    fn v12() -> Image {
        Image::initialised(2)
    }

    fn slot_at(i: usize) -> usize {
        off::PROCS + off::SLOT * i
    }

    /// Puts `pid` (tag 0: a C peer's slot, matched by pid) running in slot `i`, and raises
    /// proc_num to cover it.
    fn slot(&mut self, i: usize, pid: i32) -> &mut Self {
        let s = Image::slot_at(i);
        self.u32(s + off::PID, pid as u32).u32(s + off::STATUS, 1);
        if (self.get_u32(off::PROC_NUM) as usize) < i + 1 {
            self.u32(off::PROC_NUM, (i + 1) as u32);
        }
        self
    }

    fn usage(&mut self, i: usize, dev: usize, context: u64, module: u64, data: u64) -> &mut Self {
        let m = Image::slot_at(i) + off::USED + off::MEM * dev;
        self.u64(m + off::CONTEXT, context)
            .u64(m + off::MODULE, module)
            .u64(m + off::DATA, data)
            .u64(m + off::TOTAL, context + module + data)
    }

    fn total(&self, i: usize, dev: usize) -> u64 {
        self.get_u64(Image::slot_at(i) + off::USED + off::MEM * dev + off::TOTAL)
    }

    fn limit(&mut self, dev: usize, bytes: u64) -> &mut Self {
        self.u64(off::LIMIT + 8 * dev, bytes)
    }

    fn write(&self, path: &Path) {
        fs::write(path, &self.0).unwrap();
    }

    fn read(path: &Path) -> Image {
        Image(fs::read(path).unwrap())
    }
}

/// A directory of its own per test, removed at the end.
struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Dir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "shrreg-tool-test-{}-{}-{name}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        fs::create_dir_all(&dir).unwrap();
        Dir(dir)
    }

    fn file(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// A child process killed and reaped when dropped.
struct Kid(Child);

impl Kid {
    fn sleeper() -> Kid {
        Kid(Command::new("sleep")
            .arg("120")
            .stdin(Stdio::null())
            .spawn()
            .unwrap())
    }

    fn pid(&self) -> i32 {
        self.0.id() as i32
    }

    fn alive(&mut self) -> bool {
        self.0.try_wait().unwrap().is_none()
    }
}

impl Drop for Kid {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The pid of a process that has exited and been reaped.
fn dead_pid() -> i32 {
    let mut c = Command::new("true").spawn().unwrap();
    let pid = c.id() as i32;
    c.wait().unwrap();
    pid
}

fn own_pid() -> i32 {
    std::process::id() as i32
}

/// Runs the tool with a clean environment for the variables it reads.
fn tool(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_shrreg-tool"));
    cmd.args(args).stdin(Stdio::null());
    for var in [
        "CUDA_DEVICE_MEMORY_SHARED_CACHE",
        "CUDA_DEVICE_MEMORY_LIMIT",
        "CUDA_DEVICE_SM_LIMIT",
        "CUDA_TASK_PRIORITY",
    ] {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn run(path: &Path, action: &str) -> Output {
    tool(&["--file", path.to_str().unwrap(), action], &[])
}

fn out(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn code(o: &Output) -> i32 {
    o.status.code().expect("killed by a signal")
}

#[track_caller]
fn expect(o: &Output, status: i32, needles: &[&str]) {
    let (so, se) = (out(o), err(o));
    assert_eq!(code(o), status, "stdout:\n{so}\nstderr:\n{se}");
    for n in needles {
        assert!(
            so.contains(n) || se.contains(n),
            "{n:?} missing;\nstdout:\n{so}\nstderr:\n{se}"
        );
    }
}

/// Runs the read-only actions and checks that the file's bytes did not change.
fn read_only_actions(path: &Path) -> [Output; 3] {
    let before = fs::read(path).unwrap();
    let outs = [
        run(path, "--print"),
        run(path, "--json"),
        run(path, "--check"),
    ];
    assert!(
        fs::read(path).unwrap() == before,
        "a read-only action changed the file"
    );
    outs
}

// ---------------------------------------------------------------------------------------------
// A minimal JSON parser, to check that --json is one well-formed object.

#[derive(Debug, PartialEq)]
enum Json {
    Null,
    Bool(bool),
    Num(String),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

impl Json {
    fn get(&self, key: &str) -> &Json {
        match self {
            Json::Obj(kv) => {
                &kv.iter()
                    .find(|(k, _)| k == key)
                    .unwrap_or_else(|| panic!("no key {key:?}"))
                    .1
            }
            other => panic!("not an object: {other:?}"),
        }
    }

    fn num(&self) -> i128 {
        match self {
            Json::Num(n) => n.parse().unwrap(),
            other => panic!("not a number: {other:?}"),
        }
    }

    fn str(&self) -> &str {
        match self {
            Json::Str(s) => s,
            other => panic!("not a string: {other:?}"),
        }
    }

    fn arr(&self) -> &[Json] {
        match self {
            Json::Arr(a) => a,
            other => panic!("not an array: {other:?}"),
        }
    }
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn parse(text: &str) -> Result<Json, String> {
        let mut p = Parser {
            s: text.as_bytes(),
            i: 0,
        };
        let v = p.value()?;
        p.ws();
        if p.i != p.s.len() {
            return Err(format!("trailing bytes at {}", p.i));
        }
        Ok(v)
    }

    fn ws(&mut self) {
        while self.i < self.s.len() && b" \t\r\n".contains(&self.s[self.i]) {
            self.i += 1;
        }
    }

    fn eat(&mut self, b: u8) -> Result<(), String> {
        self.ws();
        if self.s.get(self.i) == Some(&b) {
            self.i += 1;
            Ok(())
        } else {
            Err(format!("expected {:?} at {}", b as char, self.i))
        }
    }

    fn lit(&mut self, word: &str, v: Json) -> Result<Json, String> {
        if self.s[self.i..].starts_with(word.as_bytes()) {
            self.i += word.len();
            Ok(v)
        } else {
            Err(format!("bad literal at {}", self.i))
        }
    }

    fn value(&mut self) -> Result<Json, String> {
        self.ws();
        match self.s.get(self.i).copied() {
            Some(b'{') => {
                self.i += 1;
                let mut kv = Vec::new();
                self.ws();
                if self.s.get(self.i) == Some(&b'}') {
                    self.i += 1;
                    return Ok(Json::Obj(kv));
                }
                loop {
                    self.ws();
                    let k = self.string()?;
                    self.eat(b':')?;
                    kv.push((k, self.value()?));
                    self.ws();
                    match self.s.get(self.i) {
                        Some(b',') => self.i += 1,
                        Some(b'}') => {
                            self.i += 1;
                            return Ok(Json::Obj(kv));
                        }
                        _ => return Err(format!("bad object at {}", self.i)),
                    }
                }
            }
            Some(b'[') => {
                self.i += 1;
                let mut items = Vec::new();
                self.ws();
                if self.s.get(self.i) == Some(&b']') {
                    self.i += 1;
                    return Ok(Json::Arr(items));
                }
                loop {
                    items.push(self.value()?);
                    self.ws();
                    match self.s.get(self.i) {
                        Some(b',') => self.i += 1,
                        Some(b']') => {
                            self.i += 1;
                            return Ok(Json::Arr(items));
                        }
                        _ => return Err(format!("bad array at {}", self.i)),
                    }
                }
            }
            Some(b'"') => Ok(Json::Str(self.string()?)),
            Some(b't') => self.lit("true", Json::Bool(true)),
            Some(b'f') => self.lit("false", Json::Bool(false)),
            Some(b'n') => self.lit("null", Json::Null),
            Some(b'-' | b'0'..=b'9') => {
                let start = self.i;
                if self.s[self.i] == b'-' {
                    self.i += 1;
                }
                let digits = self.i;
                while self.i < self.s.len() && self.s[self.i].is_ascii_digit() {
                    self.i += 1;
                }
                if self.i == digits || (self.s[digits] == b'0' && self.i - digits > 1) {
                    return Err(format!("bad number at {start}"));
                }
                Ok(Json::Num(
                    String::from_utf8(self.s[start..self.i].to_vec()).unwrap(),
                ))
            }
            _ => Err(format!("unexpected byte at {}", self.i)),
        }
    }

    fn string(&mut self) -> Result<String, String> {
        if self.s.get(self.i) != Some(&b'"') {
            return Err(format!("expected a string at {}", self.i));
        }
        self.i += 1;
        let mut out = Vec::new();
        loop {
            let b = *self.s.get(self.i).ok_or("unterminated string")?;
            self.i += 1;
            match b {
                b'"' => return String::from_utf8(out).map_err(|e| e.to_string()),
                b'\\' => {
                    let e = *self.s.get(self.i).ok_or("bad escape")?;
                    self.i += 1;
                    match e {
                        b'"' | b'\\' | b'/' => out.push(e),
                        b'n' => out.push(b'\n'),
                        b'r' => out.push(b'\r'),
                        b't' => out.push(b'\t'),
                        b'b' => out.push(8),
                        b'f' => out.push(12),
                        b'u' => {
                            let hex = std::str::from_utf8(&self.s[self.i..self.i + 4])
                                .map_err(|e| e.to_string())?;
                            let c = u32::from_str_radix(hex, 16).map_err(|e| e.to_string())?;
                            self.i += 4;
                            let ch = char::from_u32(c).ok_or("surrogate escapes not expected")?;
                            out.extend_from_slice(ch.to_string().as_bytes());
                        }
                        _ => return Err(format!("bad escape at {}", self.i)),
                    }
                }
                0..=0x1f => return Err(format!("raw control byte in string at {}", self.i)),
                _ => out.push(b),
            }
        }
    }
}

fn json_of(o: &Output) -> Json {
    let text = out(o);
    let v = Parser::parse(&text).unwrap_or_else(|e| panic!("{e}:\n{text}"));
    assert!(matches!(v, Json::Obj(_)), "not an object");
    v
}

fn finding_kinds(j: &Json) -> Vec<String> {
    j.get("findings")
        .arr()
        .iter()
        .map(|f| f.get("kind").str().to_owned())
        .collect()
}

#[test]
fn json_parser_accepts_and_rejects() {
    assert!(Parser::parse(r#"{"a":[1,-2,{"b":"x\"\u0001"}],"c":null,"d":true}"#).is_ok());
    assert!(Parser::parse(r#"{"a":1,}"#).is_err());
    assert!(Parser::parse(r#"{"a":1}}"#).is_err());
    assert!(Parser::parse("{\"a\":\"\n\"}").is_err());
}

// ---------------------------------------------------------------------------------------------
// Images.

#[test]
fn healthy_region_with_two_live_slots() {
    let dir = Dir::new("healthy");
    let path = dir.file("region");
    let kid = Kid::sleeper();
    let mut img = Image::v12();
    img.limit(0, 1024 * MIB)
        .u64(off::SM_LIMIT, 50)
        .slot(0, own_pid())
        .usage(0, 0, 300 * MIB, 2 * MIB, 100 * MIB)
        .slot(1, kid.pid())
        .usage(1, 0, 300 * MIB, 0, 200 * MIB)
        .u64(Image::slot_at(1) + off::SEQLOCK, 6)
        .u32(Image::slot_at(1) + off::HOSTPID, 4242);
    img.write(&path);
    fs::set_permissions(&path, fs::Permissions::from_mode(0o444)).unwrap();

    let [print, json, check] = read_only_actions(&path);
    expect(
        &print,
        0,
        &[
            "v1.2, ready",
            "version 1.2",
            "GPU-8a3b1c2d-0000-1111-2222-333344445555",
            "1073741824 (1.00 GiB)",
            "50%",
            "proc_num 2",
            "free (owner_pid 0)",
            "value 1, waiters 0, process-shared",
            &own_pid().to_string(),
            &kid.pid().to_string(),
            "4242",
            "alive",
            "PID namespace",
            "healthy",
        ],
    );
    expect(&check, 0, &["healthy"]);

    assert_eq!(code(&json), 0);
    let j = json_of(&json);
    assert_eq!(j.get("verdict").str(), "ready");
    assert_eq!(j.get("file_size").num(), off::SIZE as i128 + 1);
    assert_eq!(j.get("region_size").num(), off::SIZE as i128);
    assert_eq!(j.get("major_version").num(), 1);
    assert_eq!(j.get("minor_version").num(), 2);
    assert_eq!(j.get("proc_num").num(), 2);
    assert_eq!(j.get("healthy"), &Json::Bool(true));
    assert!(j.get("findings").arr().is_empty());
    let owner = j.get("owner_lock");
    assert_eq!(owner.get("owner_pid").num(), 0);
    assert_eq!(owner.get("liveness"), &Json::Null);
    assert_eq!(owner.get("sem").get("value").num(), 1);
    assert_eq!(owner.get("sem").get("process_shared"), &Json::Bool(true));
    let devices = j.get("devices").arr();
    assert_eq!(devices.len(), 16);
    assert_eq!(devices[0].get("limit").num(), (1024 * MIB) as i128);
    assert_eq!(devices[0].get("used").num(), (902 * MIB) as i128);
    assert_eq!(devices[0].get("sm_limit").num(), 50);
    let slots = j.get("slots").arr();
    assert_eq!(slots.len(), 2);
    assert_eq!(slots[0].get("pid").num(), own_pid() as i128);
    assert_eq!(slots[0].get("liveness").str(), "alive");
    assert_eq!(slots[0].get("status_name").str(), "running");
    let u = &slots[0].get("usage").arr()[0];
    assert_eq!(u.get("device").num(), 0);
    assert_eq!(u.get("total").num(), (402 * MIB) as i128);
    assert_eq!(u.get("context").num(), (300 * MIB) as i128);
    assert_eq!(u.get("module").num(), (2 * MIB) as i128);
    assert_eq!(u.get("data").num(), (100 * MIB) as i128);
    assert_eq!(slots[1].get("pid").num(), kid.pid() as i128);
    assert_eq!(slots[1].get("hostpid").num(), 4242);
    assert_eq!(slots[1].get("seqlock").num(), 6);
    assert_eq!(slots[1].get("seqlock_odd"), &Json::Bool(false));
    assert_eq!(slots[1].get("liveness").str(), "alive");
}

#[test]
fn dead_slot_and_dead_owner_are_found_then_reaped() {
    let dir = Dir::new("dead");
    let path = dir.file("region");
    let dead = dead_pid();
    let dead_owner = dead_pid();
    let kid = Kid::sleeper();
    let mut img = Image::v12();
    img.limit(0, 1024 * MIB)
        .slot(0, own_pid())
        .usage(0, 0, 10 * MIB, 0, 10 * MIB)
        .slot(1, dead)
        .usage(1, 0, 100 * MIB, 0, 400 * MIB)
        .usage(1, 3, 0, 0, 7 * MIB)
        // A live process whose pid a dead tagged owner of slot 2 once had (PID reuse, B21).
        .slot(2, kid.pid())
        .u64(
            Image::slot_at(2) + off::TAG,
            (u64::from(kid.pid() as u32) << 32) | 0x8000_0001,
        )
        .usage(2, 0, 0, 0, MIB)
        // The dead owner took the token: the semaphore is at 0.
        .u64(off::OWNER, dead_owner as u64)
        .u64(off::SEM, 0);
    img.write(&path);

    let [print, json, check] = read_only_actions(&path);
    expect(&print, 0, &["dead", &format!("held by pid {dead_owner}")]);
    expect(
        &check,
        1,
        &[
            &format!("slot 1: pid {dead} is dead"),
            &format!("slot 2: pid {} (start tag 0x80000001) is dead", kid.pid()),
            &format!("held by pid {dead_owner}"),
            "--reap",
        ],
    );
    let j = json_of(&json);
    assert_eq!(j.get("healthy"), &Json::Bool(false));
    let kinds = finding_kinds(&j);
    assert!(kinds.contains(&"stale_slot".to_owned()), "{kinds:?}");
    assert!(kinds.contains(&"dead_owner".to_owned()), "{kinds:?}");
    assert_eq!(j.get("owner_lock").get("liveness").str(), "dead");
    assert_eq!(j.get("owner_lock").get("pid").num(), dead_owner as i128);
    assert_eq!(j.get("slots").arr()[1].get("liveness").str(), "dead");

    let reap = run(&path, "--reap");
    expect(
        &reap,
        0,
        &[
            &format!("recovered the owner lock from dead pid {dead_owner}"),
            "reaped 2 slots",
            &format!("pids {dead}, {}", kid.pid()),
        ],
    );
    let after = Image::read(&path);
    let s1 = Image::slot_at(1);
    assert_eq!(after.get_u32(s1 + off::PID), 0, "dead slot freed");
    assert_eq!(after.total(1, 0), 0, "its usage zeroed");
    assert_eq!(after.total(1, 3), 0, "on every device");
    assert_eq!(
        after.get_u32(Image::slot_at(2) + off::PID),
        0,
        "reused pid: freed"
    );
    assert_eq!(after.total(2, 0), 0);
    assert_eq!(
        after.get_u32(Image::slot_at(0) + off::PID) as i32,
        own_pid()
    );
    assert_eq!(after.total(0, 0), 20 * MIB, "the live slot is untouched");
    assert_eq!(after.get_u64(off::OWNER), 0, "lock released");
    assert_eq!(after.get_u32(off::SEM), 1, "token back, exactly one");
    assert_eq!(after.get_u32(off::SEM + off::SEM_PRIVATE), SHARED);
    expect(&run(&path, "--check"), 0, &["healthy"]);
    // A second reap frees nothing.
    expect(&run(&path, "--reap"), 0, &["reaped 0 slots"]);
}

#[test]
fn reap_zeroes_usage_left_in_free_slots() {
    let dir = Dir::new("leftover");
    let path = dir.file("region");
    let mut img = Image::v12();
    img.slot(0, own_pid()).slot(1, 0).usage(1, 0, MIB, 0, MIB);
    img.u32(Image::slot_at(1) + off::STATUS, 0);
    img.write(&path);
    expect(
        &run(&path, "--check"),
        1,
        &["slot 1 is free but still carries 2097152 bytes"],
    );
    expect(
        &run(&path, "--reap"),
        0,
        &["reaped 0 slots", "zeroed the usage left in 1 free slot"],
    );
    assert_eq!(Image::read(&path).total(1, 0), 0);
    expect(&run(&path, "--check"), 0, &["healthy"]);
}

#[test]
fn odd_seqlock_is_reported() {
    let dir = Dir::new("odd");
    let path = dir.file("region");
    let mut img = Image::v12();
    img.slot(0, own_pid())
        .usage(0, 0, MIB, 0, 0)
        .u64(Image::slot_at(0) + off::SEQLOCK, 7);
    img.write(&path);
    let [print, json, check] = read_only_actions(&path);
    expect(&print, 0, &["7 ODD", "(inconsistent read)"]);
    expect(&check, 1, &["slot 0: seqlock 7 stays odd"]);
    let j = json_of(&json);
    assert_eq!(
        j.get("slots").arr()[0].get("seqlock_odd"),
        &Json::Bool(true)
    );
    assert_eq!(
        j.get("slots").arr()[0].get("usage").arr()[0].get("consistent"),
        &Json::Bool(false)
    );
    assert!(finding_kinds(&j).contains(&"odd_seqlock".to_owned()));
}

#[test]
fn usage_over_the_limit_is_reported() {
    let dir = Dir::new("over");
    let path = dir.file("region");
    let kid = Kid::sleeper();
    let mut img = Image::v12();
    img.limit(0, 100 * MIB)
        .slot(0, own_pid())
        .usage(0, 0, 0, 0, 60 * MIB)
        .slot(1, kid.pid())
        .usage(1, 0, 0, 0, 60 * MIB);
    img.write(&path);
    let [_, json, check] = read_only_actions(&path);
    expect(
        &check,
        1,
        &["device 0: usage 125829120 bytes (120.00 MiB) is over the limit 104857600 bytes"],
    );
    assert!(finding_kinds(&json_of(&json)).contains(&"over_limit".to_owned()));
}

#[test]
fn garbage_proc_num_and_counters_are_reported() {
    let dir = Dir::new("garbage");
    let path = dir.file("region");
    let mut img = Image::v12();
    img.slot(0, own_pid()).usage(0, 0, MIB, 0, MIB);
    // total that is not the sum, and an underflowed counter on another device.
    img.u64(Image::slot_at(0) + off::USED + off::TOTAL, 5 * MIB);
    let dev1 = Image::slot_at(0) + off::USED + off::MEM;
    img.u64(dev1 + off::DATA, u64::MAX - 4095)
        .u64(dev1 + off::TOTAL, u64::MAX - 4095);
    img.u32(off::PROC_NUM, 5000);
    img.write(&path);
    let [print, json, check] = read_only_actions(&path);
    expect(&print, 0, &["proc_num 5000", "free (1023 slots)"]);
    expect(
        &check,
        1,
        &[
            "proc_num is 5000, outside 0..=1024",
            "slot 0 device 0: total 5242880 is not context 1048576 + module 0 + data 1048576",
            "slot 0 device 1: data is 18446744073709547520 (over 2^56)",
        ],
    );
    let j = json_of(&json);
    assert_eq!(j.get("proc_num").num(), 5000);
    assert_eq!(j.get("slots").arr().len(), 1024, "clamped to the table");
    let kinds = finding_kinds(&j);
    for k in [
        "proc_num_out_of_range",
        "counter_mismatch",
        "counter_garbage",
    ] {
        assert!(kinds.contains(&k.to_owned()), "{k} in {kinds:?}");
    }
}

#[test]
fn v11_l0_region_is_read_and_not_repaired() {
    let dir = Dir::new("v11");
    let path = dir.file("region");
    let mut img = Image::initialised(1);
    img.limit(0, 512 * MIB)
        .slot(0, own_pid())
        .usage(0, 0, MIB, 0, 3 * MIB);
    img.write(&path);
    let [print, json, check] = read_only_actions(&path);
    expect(
        &print,
        0,
        &[
            "v1.1 (pre-PR155 layout",
            "version 1.1",
            "never initialised (all zero)",
        ],
    );
    expect(
        &check,
        0,
        &["sem_postinit was never initialised", "healthy"],
    );
    let j = json_of(&json);
    assert_eq!(j.get("verdict").str(), "legacy_v1.1");
    assert_eq!(
        j.get("sem_postinit").get("never_initialised"),
        &Json::Bool(true)
    );
    assert_eq!(
        j.get("slots").arr()[0].get("usage").arr()[0]
            .get("total")
            .num(),
        (4 * MIB) as i128
    );
    // An L0 file that an L1 process extended (SIZE + 33 bytes) is still L0.
    img.0.resize(off::SIZE + 33, 0);
    img.write(&path);
    expect(&run(&path, "--check"), 0, &["v1.1 (pre-PR155 layout"]);
}

#[test]
fn refused_layouts_are_clear_errors() {
    let dir = Dir::new("refused");
    let path = dir.file("region");
    let shown = path.to_str().unwrap().to_owned();

    // PR 155's shifted v1.1: 32 bytes longer, a live sem_postinit at 56 (private 0x80 at 64).
    let mut l1 = Image::zeroed(off::SIZE + 33);
    l1.u32(off::FLAG, MAGIC as u32)
        .u32(off::MAJOR, 1)
        .u32(off::MINOR, 1)
        .u64(56, 1)
        .u32(64, SHARED);
    l1.write(&path);
    for action in [
        "--print",
        "--json",
        "--check",
        "--reap",
        "--suspend",
        "--create-new",
    ] {
        let before = fs::read(&path).unwrap();
        let o = run(&path, action);
        expect(&o, 2, &[&shown, "PR 155", "delete the file"]);
        assert!(out(&o).is_empty(), "{action}: nothing on stdout");
        assert_eq!(
            err(&o).lines().count(),
            1,
            "{action}: one line: {}",
            err(&o)
        );
        assert!(
            fs::read(&path).unwrap() == before,
            "{action} changed a refused file"
        );
    }

    // Truncated.
    let mut short = Image::zeroed(1000);
    short
        .u32(off::FLAG, MAGIC as u32)
        .u32(off::MAJOR, 1)
        .u32(off::MINOR, 2);
    short.write(&path);
    for action in ["--print", "--check", "--reap", "--create-new"] {
        expect(
            &run(&path, action),
            2,
            &[&shown, "1000 bytes, shorter than a shared region"],
        );
    }
    assert_eq!(
        fs::read(&path).unwrap().len(),
        1000,
        "never extended nor truncated"
    );

    // Random bytes of a region's size.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let random: Vec<u8> = (0..off::SIZE + 40)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    fs::write(&path, &random[..off::SIZE + 1]).unwrap();
    let flag = i32::from_le_bytes(random[0..4].try_into().unwrap());
    assert!(![0, 1, MAGIC].contains(&flag));
    expect(
        &run(&path, "--check"),
        2,
        &[&shown, "not a shared region's magic"],
    );
    expect(&run(&path, "--json"), 2, &["not a shared region's magic"]);

    // Random bytes of another size.
    fs::write(&path, &random[..off::SIZE + 7]).unwrap();
    expect(
        &run(&path, "--print"),
        2,
        &["which no known region layout has"],
    );

    // An unknown version.
    let mut v9 = Image::v12();
    v9.u32(off::MAJOR, 9);
    v9.write(&path);
    expect(&run(&path, "--check"), 2, &["region version 9.2"]);

    // No file, and a directory.
    let missing = dir.file("missing");
    expect(&run(&missing, "--print"), 2, &["no such file", "--file"]);
    expect(&run(&dir.0, "--check"), 2, &["not a regular file"]);
    assert!(
        !missing.exists(),
        "a read-only action never creates the file"
    );

    // The version still prints, with the file's verdict.
    fs::write(&path, &random[..off::SIZE + 7]).unwrap();
    expect(
        &run(&path, "--version"),
        0,
        &["refused", "which no known region layout has"],
    );
}

#[test]
fn empty_and_zeroed_files_are_not_initialised() {
    let dir = Dir::new("empty");
    let path = dir.file("region");
    fs::write(&path, b"").unwrap();
    let [print, json, check] = read_only_actions(&path);
    expect(&print, 0, &["not initialised"]);
    expect(&check, 0, &["not initialised yet", "healthy"]);
    assert_eq!(json_of(&json).get("verdict").str(), "fresh");
    expect(&run(&path, "--reap"), 0, &["nothing to reap"]);
    assert_eq!(
        fs::read(&path).unwrap().len(),
        0,
        "reap leaves an empty file alone"
    );

    Image::zeroed(off::SIZE + 1).write(&path);
    let [print, _, check] = read_only_actions(&path);
    expect(&print, 0, &["not initialised (fresh)"]);
    expect(&check, 0, &["not initialised yet"]);

    let mut interrupted = Image::zeroed(off::SIZE + 1);
    interrupted.u32(off::FLAG, 1);
    interrupted.write(&path);
    expect(&run(&path, "--check"), 1, &["an initialiser died half-way"]);
    expect(&run(&path, "--reap"), 2, &["interrupted", "--create-new"]);
}

#[test]
fn create_new_refuses_with_a_live_slot_unless_forced() {
    let dir = Dir::new("create-live");
    let path = dir.file("region");
    let p = path.to_str().unwrap();
    let kid = Kid::sleeper();
    let mut img = Image::v12();
    img.limit(0, 8 * MIB)
        .slot(0, dead_pid())
        .usage(0, 0, 0, 0, 9 * MIB)
        .slot(1, kid.pid())
        .usage(1, 0, MIB, 0, 0);
    img.write(&path);
    let before = fs::read(&path).unwrap();
    let env = [
        ("CUDA_DEVICE_MEMORY_LIMIT", "64m"),
        ("CUDA_DEVICE_SM_LIMIT", "30"),
    ];
    let o = tool(&["--file", p, "--create-new"], &env);
    expect(
        &o,
        2,
        &[
            "refusing to re-initialise",
            &format!("pid {}", kid.pid()),
            "--force",
        ],
    );
    assert!(
        fs::read(&path).unwrap()[..before.len()] == before[..],
        "a refused --create-new writes nothing in the region (its open adds our tail)"
    );

    let o = tool(&["--create-new", "--file", p, "--force"], &env);
    expect(
        &o,
        0,
        &["re-initialised as v1.2", "67108864 bytes", "register again"],
    );
    let after = Image::read(&path);
    assert_eq!(
        after.0.len(),
        hami_shm::layout::EXT_END + 1,
        "same file, with our tail"
    );
    assert_eq!(after.get_u32(off::FLAG), MAGIC as u32);
    assert_eq!(
        (after.get_u32(off::MAJOR), after.get_u32(off::MINOR)),
        (1, 2)
    );
    assert_eq!(after.get_u32(off::PROC_NUM), 0);
    assert_eq!(after.get_u64(off::LIMIT), 64 * MIB);
    assert_eq!(after.get_u64(off::LIMIT + 8 * 15), 64 * MIB);
    assert_eq!(after.get_u64(off::SM_LIMIT), 30);
    assert_eq!(after.get_u64(off::OWNER), 0);
    assert_eq!(after.get_u32(off::SEM), 1);
    assert_eq!(after.get_u32(off::SEM + off::SEM_PRIVATE), SHARED);
    assert_eq!(after.get_u32(off::POSTINIT), 1);
    assert_eq!(after.get_u32(off::POSTINIT + off::SEM_PRIVATE), SHARED);
    for i in 0..2 {
        assert_eq!(after.get_u32(Image::slot_at(i) + off::PID), 0);
        assert_eq!(after.total(i, 0), 0);
    }
    assert_eq!(
        after.0[off::UUIDS..off::UUIDS + 4],
        *b"GPU-",
        "device UUIDs are kept"
    );
    expect(&run(&path, "--check"), 0, &["healthy"]);
}

#[test]
fn create_new_proceeds_when_every_slot_is_dead() {
    let dir = Dir::new("create-dead");
    let path = dir.file("region");
    let p = path.to_str().unwrap();
    // A v1.1 file whose processes are all gone, with a dead lock owner.
    let mut img = Image::initialised(1);
    img.slot(0, dead_pid())
        .usage(0, 0, 0, 0, MIB)
        .slot(3, dead_pid())
        .u64(off::OWNER, dead_pid() as u64)
        .u64(off::SEM, 0);
    img.write(&path);
    let o = tool(&["--file", p, "--create-new"], &[]);
    expect(
        &o,
        0,
        &["re-initialised as v1.2 (was v1.1", "no memory limit"],
    );
    let after = Image::read(&path);
    assert_eq!(after.get_u32(off::MINOR), 2);
    assert_eq!(
        after.get_u32(off::POSTINIT + off::SEM_PRIVATE),
        SHARED,
        "B1 gone"
    );
    assert_eq!(after.get_u32(off::PROC_NUM), 0);
    assert_eq!(after.get_u64(off::LIMIT), 0);
    expect(&run(&path, "--check"), 0, &["healthy"]);

    // A missing file is created and initialised.
    let fresh = dir.file("new");
    let o = tool(&["--file", fresh.to_str().unwrap(), "--create-new"], &[]);
    expect(&o, 0, &["re-initialised as v1.2 (was not initialised"]);
    assert_eq!(
        fs::read(&fresh).unwrap().len(),
        hami_shm::layout::EXT_END + 1
    );
    expect(&run(&fresh, "--check"), 0, &["healthy"]);
}

/// Whether `pid` catches `sig` (bit `sig - 1` of SigCgt).
fn catches(pid: i32, sig: i32) -> bool {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|m| m & (1 << (sig - 1)) != 0)
}

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A shell that writes `marker` when it gets `sig` (after its trap is installed).
fn trapper(marker: &Path, sig: &str, signo: i32) -> Kid {
    let script = format!("trap 'echo got > \"$0\"' {sig}; while :; do sleep 0.05; done");
    let kid = Kid(Command::new("sh")
        .args(["-c", &script, marker.to_str().unwrap()])
        .stdin(Stdio::null())
        .spawn()
        .unwrap());
    let pid = kid.pid();
    wait_for("the trap", || catches(pid, signo));
    kid
}

#[test]
fn suspend_and_resume_signal_only_live_handlers_never_pid_0() {
    let dir = Dir::new("signals");
    let path = dir.file("region");
    let usr2 = dir.file("usr2");
    let usr1 = dir.file("usr1");
    let mut handler2 = trapper(&usr2, "USR2", libc::SIGUSR2);
    let mut handler1 = trapper(&usr1, "USR1", libc::SIGUSR1);
    let mut plain = Kid::sleeper();
    let dead = dead_pid();
    let mut img = Image::v12();
    img.slot(0, 0)
        .slot(1, dead)
        .slot(2, plain.pid())
        .slot(3, handler2.pid())
        .slot(4, handler1.pid());
    img.u32(Image::slot_at(0) + off::STATUS, 0);
    img.write(&path);
    let before = fs::read(&path).unwrap();

    let o = run(&path, "--suspend");
    expect(
        &o,
        0,
        &[
            "skipped 1 free slot (pid 0: never signalled",
            &format!("slot 1: pid {dead}: skipped: dead"),
            &format!(
                "slot 2: pid {}: skipped: it does not handle SIGUSR2",
                plain.pid()
            ),
            &format!("slot 3: pid {}: sent SIGUSR2", handler2.pid()),
            &format!(
                "slot 4: pid {}: skipped: it does not handle SIGUSR2",
                handler1.pid()
            ),
            "sent SIGUSR2 to 1 process",
        ],
    );
    wait_for("the SIGUSR2 trap", || usr2.exists());
    assert!(!usr1.exists());

    let o = run(&path, "--resume");
    expect(
        &o,
        0,
        &[
            "skipped 1 free slot",
            &format!("slot 4: pid {}: sent SIGUSR1", handler1.pid()),
            "sent SIGUSR1 to 1 process",
        ],
    );
    wait_for("the SIGUSR1 trap", || usr1.exists());
    assert!(
        plain.alive(),
        "a process without a handler was not signalled"
    );
    assert!(handler1.alive() && handler2.alive());
    assert!(
        fs::read(&path).unwrap() == before,
        "signalling writes nothing to the file"
    );
}

#[test]
fn arguments_and_version() {
    expect(
        &tool(&["--help"], &[]),
        0,
        &["usage: shrreg-tool", "--create-new", "exit status"],
    );
    expect(&tool(&[], &[]), 2, &["no action given", "--help"]);
    expect(
        &tool(&["--bogus"], &[]),
        2,
        &["unknown argument \"--bogus\""],
    );
    expect(
        &tool(&["--print", "--check"], &[]),
        2,
        &["exactly one action"],
    );
    expect(
        &tool(&["--print", "--force"], &[]),
        2,
        &["--force only applies"],
    );
    expect(&tool(&["--file"], &[]), 2, &["--file needs a path"]);

    let dir = Dir::new("version");
    let path = dir.file("region");
    Image::v12().write(&path);
    let o = tool(&["--version", &format!("--file={}", path.display())], &[]);
    expect(
        &o,
        0,
        &[
            &format!("shrreg-tool {}", env!("CARGO_PKG_VERSION")),
            "region layout 1.2",
            "region size 2008952 bytes",
            "2008953 bytes, version 1.2 (ready)",
        ],
    );
    // The default file comes from CUDA_DEVICE_MEMORY_SHARED_CACHE.
    let o = tool(
        &["--check"],
        &[("CUDA_DEVICE_MEMORY_SHARED_CACHE", path.to_str().unwrap())],
    );
    expect(&o, 0, &[path.to_str().unwrap(), "healthy"]);
}

// ---------------------------------------------------------------------------------------------
// The report logic, on small regions in memory.

fn info(verdict: Verdict) -> FileInfo {
    FileInfo {
        path: "mem".into(),
        len: 0,
        verdict,
    }
}

#[test]
fn findings_of_small_regions() {
    let r = Region::<4, 2>::zeroed();
    let alive = |_: ProcId| Liveness::Alive;
    let rep = inspect::snapshot(&r, info(Verdict::Fresh), &alive, 1);
    assert_eq!(inspect::findings(&rep), vec![Finding::NotInitialised]);
    assert!(!inspect::has_problems(&inspect::findings(&rep)));

    r.raw_initialized_flag().store(MAGIC, Ordering::Relaxed);
    r.raw_sem().raw_words()[0].store(1, Ordering::Relaxed);
    r.raw_sem().raw_words()[1].store(0x80, Ordering::Relaxed);
    r.raw_sem_postinit().raw_words()[1].store(0x80, Ordering::Relaxed);
    r.raw_sem_postinit().raw_words()[0].store(1, Ordering::Relaxed);
    r.raw_proc_num().store(3, Ordering::Relaxed);
    r.raw_procs()[0].raw_pid().store(10, Ordering::Relaxed);
    r.raw_procs()[0].raw_status().store(1, Ordering::Relaxed);
    r.raw_procs()[1].raw_pid().store(11, Ordering::Relaxed);
    // Our identity word: the pid above the start tag.
    r.raw_procs()[1].raw_unused()[0].store((11 << 32) | 0x8000_0005, Ordering::Relaxed);
    r.raw_procs()[2].raw_pid().store(10, Ordering::Relaxed);
    r.raw_procs()[2].raw_status().store(7, Ordering::Relaxed);
    r.raw_limit()[1].store(100, Ordering::Relaxed);
    r.raw_procs()[0].raw_used()[1]
        .raw_data_size()
        .store(150, Ordering::Relaxed);
    r.raw_procs()[0].raw_used()[1]
        .raw_total()
        .store(150, Ordering::Relaxed);
    let dead_11 = |id: ProcId| {
        if id.pid() == 11 {
            assert_eq!(id.tag(), 0x8000_0005, "liveness gets the start tag");
            Liveness::Dead
        } else {
            Liveness::Alive
        }
    };
    let rep = inspect::snapshot(&r, info(Verdict::Ready), &dead_11, 1);
    let found = inspect::findings(&rep);
    assert_eq!(
        found,
        vec![
            Finding::StaleSlot {
                slot: 1,
                pid: 11,
                tag: 0x8000_0005
            },
            Finding::DuplicatePid {
                slot: 2,
                first: 0,
                pid: 10
            },
            Finding::BadStatus { slot: 2, status: 7 },
            Finding::OverLimit {
                dev: 1,
                used: 150,
                limit: 100
            },
        ]
    );
    // The device list and the usage rows keep what the table shows.
    assert_eq!(rep.devices.len(), 2);
    assert_eq!(rep.devices[1].used, 150);
    assert_eq!(
        rep.slots[0].usage.len(),
        1,
        "device 1 only (usage and limit)"
    );
    assert_eq!(rep.slots[1].usage.len(), 1, "device 1 has a limit");

    // A transient finding must be seen twice.
    let odd = Finding::OddSeqlock { slot: 0, value: 3 };
    let moved = Finding::OddSeqlock { slot: 0, value: 5 };
    let stale = Finding::StaleSlot {
        slot: 1,
        pid: 11,
        tag: 0,
    };
    assert_eq!(
        inspect::confirm(std::slice::from_ref(&odd), vec![moved, stale.clone()]),
        vec![stale.clone()]
    );
    assert_eq!(
        inspect::confirm(std::slice::from_ref(&odd), vec![odd.clone()]),
        vec![odd]
    );

    // The JSON of a report parses, strings escaped.
    let mut rep = rep;
    rep.file.path = "we\"ird\\path\n\u{1}".into();
    let text = inspect::render_json(&rep, &found);
    let j = Parser::parse(&text).unwrap();
    assert_eq!(j.get("file").str(), "we\"ird\\path\n\u{1}");
    assert_eq!(j.get("slots").arr().len(), 3);
    assert_eq!(finding_kinds(&j)[0], "stale_slot");
    let table = inspect::render_text(&rep, &found);
    assert!(table.contains("PROBLEM: slot 1: pid 11 (start tag 0x80000005) is dead"));
    assert!(table.contains("invalid(7)"));
}

#[test]
fn json_strings_are_escaped() {
    assert_eq!(inspect::json_string("a\"b\\c"), r#""a\"b\\c""#);
    assert_eq!(
        inspect::json_string("\n\t\u{0}\u{7f}é"),
        "\"\\n\\t\\u0000\\u007fé\""
    );
}

#[test]
fn human_sizes() {
    assert_eq!(inspect::human(0), "0 B");
    assert_eq!(inspect::human(1023), "1023 B");
    assert_eq!(inspect::human(3 * MIB), "3.00 MiB");
    assert_eq!(inspect::human(1 << 30), "1.00 GiB");
}

/// Issue 16: `--print` died of SIGBUS in 7 of 200 runs while the file was truncated and written
/// again under it. The tool now reads a private copy (pread) for the read-only actions, and its
/// read-write mapping (`--reap`) is guarded by `region_guard`, so no run may die of a signal,
/// whatever it reports (exit 0, or 2 with one line, such as "the file changed while it was
/// read").
#[test]
fn a_file_truncated_under_the_tool_never_crashes_it() {
    use std::os::unix::fs::FileExt as _;
    use std::os::unix::process::ExitStatusExt as _;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    let dir = Dir::new("truncated-under");
    let path = dir.file("r.cache");
    let mut img = Image::v12();
    for i in 0..64 {
        img.slot(i * 16, dead_pid()).usage(i * 16, 0, MIB, 0, MIB);
    }
    img.write(&path);
    let stop = Arc::new(AtomicBool::new(false));
    let cuts = Arc::new(AtomicUsize::new(0));
    let cutter = {
        let (stop, cuts, path, bytes) = (stop.clone(), cuts.clone(), path.clone(), img.0.clone());
        std::thread::spawn(move || {
            let f = fs::OpenOptions::new().write(true).open(&path).unwrap();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                // Whole for a moment (so runs open and read it), then cut to nothing or to one
                // page and written back.
                std::thread::sleep(Duration::from_micros(500));
                f.set_len(if n.is_multiple_of(2) { 0 } else { 4096 })
                    .unwrap();
                f.write_all_at(&bytes, 0).unwrap();
                cuts.fetch_add(1, Ordering::Relaxed);
                n += 1;
            }
        })
    };
    let actions = ["--print", "--json", "--check", "--reap", "--suspend"];
    let (mut signalled, mut ok, mut changed, mut cut_under) = (Vec::new(), 0, 0, 0);
    // At least 200 runs, and on until the file was cut 200 times and 100 runs had it cut while
    // they ran (a loaded machine cuts less often: 200 runs once saw 197 cuts).
    let mut runs = 0;
    while (runs < 200 || cut_under < 100 || cuts.load(Ordering::Relaxed) < 200) && runs < 2000 {
        let i = runs;
        runs += 1;
        let cuts_before = cuts.load(Ordering::Relaxed);
        let o = run(&path, actions[i % actions.len()]);
        if cuts.load(Ordering::Relaxed) > cuts_before {
            cut_under += 1;
        }
        match o.status.signal() {
            Some(sig) => signalled.push(sig),
            None if code(&o) == 2 => {
                let e = err(&o);
                assert!(!e.trim_end().contains('\n'), "one line: {e}");
                changed += 1;
            }
            None => ok += 1,
        }
    }
    stop.store(true, Ordering::Relaxed);
    cutter.join().unwrap();
    eprintln!(
        "{runs} runs under {} truncations ({cut_under} runs saw one): {ok} done, {changed} \
         refused in one line (exit 2), {} killed",
        cuts.load(Ordering::Relaxed),
        signalled.len()
    );
    assert!(signalled.is_empty(), "runs killed by signals {signalled:?}");
    assert!(
        cuts.load(Ordering::Relaxed) >= 200,
        "the file was cut under the runs"
    );
    assert!(
        cut_under >= 100,
        "only {cut_under} of {runs} runs had the file cut while they ran"
    );
}

/// The extension page after the region: absent from a file a C peer made, shown (marked, the
/// buckets in use) once one of our processes extended the file.
#[test]
fn the_extension_page_is_reported() {
    use hami_shm::layout::{EXT_END, EXT_MAGIC, EXT_OFFSET};
    let dir = Dir::new("ext");
    let path = dir.file("region");
    let mut img = Image::v12();
    img.write(&path);
    let j = json_of(&run(&path, "--json"));
    assert_eq!(j.get("ext"), &Json::Null, "a C peer's file has no tail");
    expect(&run(&path, "--print"), 0, &["extension     none"]);

    img.0.resize(EXT_END + 1, 0);
    let bucket = EXT_OFFSET + 16 + 3 * 40;
    img.u64(EXT_OFFSET, EXT_MAGIC)
        .u32(EXT_OFFSET + 8, 1)
        .u32(EXT_OFFSET + 12, 16)
        .u64(bucket, (-5i64) as u64)
        .u64(bucket + 8, 1234)
        .u64(bucket + 24, (4242u64 << 32) | 99)
        .u64(bucket + 32, 777);
    img.write(&path);
    let j = json_of(&run(&path, "--json"));
    let e = j.get("ext");
    assert_eq!(e.get("marked"), &Json::Bool(true));
    assert_eq!(e.get("version").num(), 1);
    let b = e.get("sm_buckets").arr();
    assert_eq!(b.len(), 1, "only the bucket in use");
    assert_eq!(b[0].get("device").num(), 3);
    assert_eq!(b[0].get("tokens").num(), -5);
    assert_eq!(b[0].get("rate").num(), 1234);
    assert_eq!(b[0].get("spent").num(), 777);
    assert_eq!(b[0].get("lease_pid").num(), 4242);
    expect(
        &run(&path, "--print"),
        0,
        &[
            "extension     version 1, 1 SM bucket in use",
            "device  3   rate 1234/s, tokens -5, spent 777, controller pid 4242",
        ],
    );
}

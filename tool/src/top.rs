//! `top`: one frame of the live view, as lines of at most [`WIDTH`] characters, so that the
//! view stays readable on an 80-column terminal whatever the path, UUIDs or counts are.

use hami_tool::inspect::{self, human, Report};

/// The widest line of a frame, in characters.
pub const WIDTH: usize = 80;

/// Lines of a frame besides its device and process rows (header, summary, headings, blank,
/// "more", note) and the cursor's line after it.
const FIXED_LINES: usize = 8;

/// What a frame shows: the report, or why the file could not be read this time.
pub type Reading<'a> = Result<&'a Report, &'a str>;

/// The frame for `path` at `now` (epoch seconds); `height` (the terminal's rows, if known)
/// bounds the process rows so that the frame does not scroll.
pub fn frame(
    path: &str,
    reading: Reading,
    now: i64,
    interval: f64,
    height: Option<usize>,
) -> String {
    let mut lines = vec![header(path, interval)];
    match reading {
        Err(why) => {
            lines.push(format!("cannot read the region: {why}"));
            lines.push(format!("(retrying every {interval} s)"));
        }
        Ok(r) => body(r, now, height, &mut lines),
    }
    let mut out = String::new();
    for l in lines {
        out.push_str(&clip(&l));
        out.push('\n');
    }
    out
}

fn header(path: &str, interval: f64) -> String {
    let tail = format!("  every {interval} s, q quits");
    let room = WIDTH.saturating_sub("top ".len() + tail.chars().count());
    let n = path.chars().count();
    let path = if n <= room {
        path.to_owned()
    } else {
        let keep: String = path.chars().skip(n + 1 - room).collect();
        format!("…{keep}")
    };
    format!("top {path}{tail}")
}

fn body(r: &Report, now: i64, height: Option<usize>, lines: &mut Vec<String>) {
    let procs: Vec<&inspect::Slot> = r.slots.iter().filter(|s| s.pid != 0).collect();
    let lkt = r.last_kernel_time as i64;
    let last = if lkt > 0 {
        format!("{} s ago", now.saturating_sub(lkt).max(0))
    } else {
        "never".to_owned()
    };
    lines.push(format!(
        "{}, {} process{}; last kernel {last}",
        inspect::verdict_text(r.file.verdict),
        procs.len(),
        if procs.len() == 1 { "" } else { "es" }
    ));
    // The devices the processes see, and any other that counts usage (garbage, but shown).
    let devices: Vec<&inspect::Device> = r
        .devices
        .iter()
        .filter(|d| (d.index as u64) < r.device_num || d.used != 0)
        .collect();
    lines.push(format!(
        "{:>3}  {:>11}  {:>11}  {:>4}  {:>8}  {:>7}  UUID",
        "DEV", "MEM LIMIT", "USED", "USE%", "SM LIMIT", "SM UTIL"
    ));
    for d in &devices {
        let (limit, pct) = if d.limit == 0 {
            ("none".to_owned(), "-".to_owned())
        } else {
            let pct = u128::from(d.used) * 100 / u128::from(d.limit);
            (human(d.limit), format!("{pct}%"))
        };
        let sm = if matches!(d.sm_limit, 0 | 100) {
            "none".to_owned()
        } else {
            format!("{}%", d.sm_limit)
        };
        let uuid = if d.uuid.is_empty() { "-" } else { &d.uuid };
        lines.push(format!(
            "{:>3}  {:>11}  {:>11}  {:>4}  {:>8}  {:>7}  {uuid}",
            d.index,
            limit,
            human(d.used),
            pct,
            sm,
            format!("{}%", r.monitor_view(d.index).sm_util)
        ));
    }
    lines.push(String::new());
    lines.push(format!(
        "{:>8}  {:>8}  {:<9}  {:<7}  {:>11}  DEVICES",
        "PID", "HOSTPID", "STATUS", "PROCESS", "USED"
    ));
    let room = height.map_or(usize::MAX, |h| {
        h.saturating_sub(FIXED_LINES + devices.len()).max(1)
    });
    for s in procs.iter().take(room) {
        let used = s
            .usage
            .iter()
            .fold(0u64, |a, du| a.saturating_add(du.usage.total));
        let devs: Vec<String> = s
            .usage
            .iter()
            .filter(|du| du.usage.total != 0)
            .map(|du| du.device.to_string())
            .collect();
        lines.push(format!(
            "{:>8}  {:>8}  {:<9}  {:<7}  {:>11}  {}",
            s.pid,
            s.hostpid,
            inspect::status_name(s.status),
            s.liveness.map_or("-", inspect::liveness_name),
            human(used),
            if devs.is_empty() {
                "-".to_owned()
            } else {
                devs.join(",")
            }
        ));
    }
    if procs.len() > room {
        lines.push(format!("… and {} more", procs.len() - room));
    }
    lines.push(
        "(the region keeps one last-kernel time for all its processes, none per process)"
            .to_owned(),
    );
}

/// `line` cut to [`WIDTH`] characters, the cut marked.
fn clip(line: &str) -> String {
    if line.chars().count() <= WIDTH {
        return line.to_owned();
    }
    let mut s: String = line.chars().take(WIDTH - 1).collect();
    s.push('…');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_paths_and_errors_stay_within_the_width() {
        let path = format!("/{}", "very-long-directory/".repeat(10));
        let why = "x".repeat(200);
        let f = frame(&path, Err(&why), 0, 1.0, None);
        assert!(f.lines().all(|l| l.chars().count() <= WIDTH), "{f}");
        assert!(f.starts_with("top …"), "{f}");
        assert!(f.contains("cannot read the region"));
    }

    #[test]
    fn clip_marks_the_cut() {
        assert_eq!(clip("abc"), "abc");
        let c = clip(&"y".repeat(100));
        assert_eq!(c.chars().count(), WIDTH);
        assert!(c.ends_with('…'));
    }
}

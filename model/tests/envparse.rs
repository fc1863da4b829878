//! Property tests of `hami_shm::envparse` against two independent models: HAMi-core's C parser
//! (`strtoul(s, &end, 0)` plus a multiplier chosen by the string's last character), which must
//! agree wherever it reads what was meant, and the documented grammar of sizes (C's numbers plus
//! the unit spellings `1gb`, `1GiB`, `512Mi`, `1tb`, ...), which must agree everywhere.
#![cfg(not(any(loom, shuttle)))]

use hami_shm::envparse::{
    device_memory_limit, device_sm_limit, parse_percent, parse_priority, parse_size, LimitSource,
    MemLimit,
};
use proptest::prelude::*;

/// What the C code computes for `s`, written from the C library's specification of `strtoul`
/// with base 0 and from HAMi-core's documented suffix rule; `None` where it overflows (strtoul
/// saturates, the multiplication is checked and gives 0 plus an error).
fn c_model(s: &str) -> Option<u64> {
    let b = s.as_bytes();
    let multiplier: u64 = match b.last() {
        Some(b'g' | b'G') => 1 << 30,
        Some(b'm' | b'M') => 1 << 20,
        Some(b'k' | b'K') => 1 << 10,
        _ => 1,
    };
    // strtoul: skip isspace, optional sign, base prefix, then the longest run of digits.
    let mut i = 0;
    while i < b.len() && matches!(b[i], b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r') {
        i += 1;
    }
    let mut negative = false;
    if i < b.len() && (b[i] == b'+' || b[i] == b'-') {
        negative = b[i] == b'-';
        i += 1;
    }
    let base: u32 = if b.len() >= i + 3
        && b[i] == b'0'
        && (b[i + 1] | 0x20) == b'x'
        && (b[i + 2] as char).is_ascii_hexdigit()
    {
        i += 2;
        16
    } else if i < b.len() && b[i] == b'0' {
        8
    } else {
        10
    };
    let mut acc: u128 = 0;
    while i < b.len() {
        match (b[i] as char).to_digit(base) {
            Some(d) => acc = acc * u128::from(base) + u128::from(d),
            None => break,
        }
        if acc > u128::from(u64::MAX) {
            return None;
        }
        i += 1;
    }
    let mut n = acc as u64;
    if negative {
        n = n.wrapping_neg();
    }
    n.checked_mul(multiplier)
}

/// The documented size grammar, written from the module docs and independently of the parser:
/// trimmed of C's whitespace, a number in C's base-0 notation, then nothing or a unit (`k`, `m`,
/// `g`, `t`, each alone or followed by `b`, `i` or `ib`, in any case; all 1024-based). Returns
/// the value and the unit as written; `None` outside the grammar or on overflow.
fn grammar_model(s: &str) -> Option<(u64, String)> {
    let t = s.trim_matches(|c| matches!(c, ' ' | '\t' | '\n' | '\x0b' | '\x0c' | '\r'));
    let lower = t.to_ascii_lowercase();
    let mut splits = vec![(t, 0u32, String::new())];
    for (letter, shift) in [("k", 10), ("m", 20), ("g", 30), ("t", 40)] {
        for tail in ["", "b", "i", "ib"] {
            let unit = format!("{letter}{tail}");
            if lower.ends_with(&unit) {
                let cut = t.len() - unit.len();
                splits.push((&t[..cut], shift, t[cut..].to_string()));
            }
        }
    }
    // No unit starts with a digit of any notation, so at most one split is a number.
    splits.into_iter().find_map(|(number, shift, unit)| {
        let n = number_model(number)?;
        Some((n.checked_mul(1u64 << shift)?, unit))
    })
}

/// C's base-0 notation, whole string: `0x`/`0X` hex, a leading `0` octal, else decimal.
fn number_model(n: &str) -> Option<u64> {
    let (digits, radix) = match n.strip_prefix("0x").or_else(|| n.strip_prefix("0X")) {
        Some(h) => (h, 16),
        None if n.starts_with('0') => (n, 8),
        None => (n, 10),
    };
    let all_digits = !digits.is_empty() && digits.chars().all(|c| c.is_digit(radix));
    all_digits.then(|| u64::from_str_radix(digits, radix).ok())?
}

#[derive(Clone, Copy, Debug)]
enum Notation {
    Dec,
    Hex { upper_x: bool, upper_digits: bool },
    Oct,
}

fn render(v: u64, notation: Notation) -> String {
    match notation {
        Notation::Dec => format!("{v}"),
        Notation::Hex {
            upper_x,
            upper_digits,
        } => {
            let x = if upper_x { "0X" } else { "0x" };
            if upper_digits {
                format!("{x}{v:X}")
            } else {
                format!("{x}{v:x}")
            }
        }
        Notation::Oct => format!("0{v:o}"),
    }
}

fn notation() -> impl Strategy<Value = Notation> {
    prop_oneof![
        Just(Notation::Dec),
        (any::<bool>(), any::<bool>()).prop_map(|(upper_x, upper_digits)| Notation::Hex {
            upper_x,
            upper_digits
        }),
        Just(Notation::Oct),
    ]
}

/// A suffix (possibly none) and its multiplier.
fn suffix() -> impl Strategy<Value = (&'static str, u64)> {
    prop::sample::select(vec![
        ("", 1u64),
        ("g", 1 << 30),
        ("G", 1 << 30),
        ("m", 1 << 20),
        ("M", 1 << 20),
        ("k", 1 << 10),
        ("K", 1 << 10),
    ])
}

/// Values spread over all magnitudes, not just huge ones.
fn magnitude() -> impl Strategy<Value = u64> {
    (0u32..64, any::<u64>()).prop_map(|(bits, x)| if bits == 0 { 0 } else { x >> (64 - bits) })
}

/// A well-formed size: (text, value) with the value's product within u64.
fn well_formed() -> impl Strategy<Value = (String, u64)> {
    (
        magnitude(),
        notation(),
        suffix(),
        prop::sample::select(vec!["", " ", "\t", "  \n"]),
    )
        .prop_map(|(v, n, (sfx, mult), lead)| {
            let v = v.min(u64::MAX / mult);
            (format!("{lead}{}{sfx}", render(v, n)), v * mult)
        })
}

/// Strings near the grammar, where the interesting mistakes live.
fn near_miss() -> impl Strategy<Value = String> {
    "[ \t0-9xXa-fgGmMkKtTiIbBlos+.%-]{0,14}"
}

/// A number followed by any accepted spelling of a unit: (text, number, multiplier).
fn with_unit() -> impl Strategy<Value = (String, u64, u64)> {
    (
        magnitude(),
        notation(),
        prop::sample::select(vec![('k', 10), ('m', 20), ('g', 30), ('t', 40)]),
        any::<bool>(),
        prop::sample::select(vec!["", "b", "B", "i", "I", "ib", "iB", "Ib", "IB"]),
        prop::sample::select(vec!["", " ", "\t\n"]),
    )
        .prop_map(|(v, n, (letter, shift), upper, tail, pad)| {
            let letter = if upper {
                letter.to_ascii_uppercase()
            } else {
                letter
            };
            (
                format!("{pad}{}{letter}{tail}{pad}", render(v, n)),
                v,
                1u64 << shift,
            )
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// (a) Every well-formed input means what HAMi-core's C parser makes of it.
    #[test]
    fn agrees_with_c_on_well_formed_input((text, value) in well_formed()) {
        prop_assert_eq!(c_model(&text), Some(value), "model sanity for {:?}", text);
        prop_assert_eq!(parse_size(&text), Ok(value), "{:?}", text);
    }

    /// Every accepted spelling of N units parses to N × unit (1024-based), or is refused as
    /// overflow when that does not fit.
    #[test]
    fn every_unit_spelling_means_n_times_the_unit((text, n, unit) in with_unit()) {
        prop_assert_eq!(parse_size(&text).ok(), n.checked_mul(unit), "{:?}", text);
    }

    /// The parser is the documented grammar: everything inside it parses to its value, and
    /// every string outside it (or overflowing) is malformed.
    #[test]
    fn parser_is_the_grammar(s in prop_oneof![any::<String>(), near_miss(), with_unit().prop_map(|t| t.0)]) {
        prop_assert_eq!(parse_size(&s).ok(), grammar_model(&s).map(|(v, _)| v), "{:?}", s);
    }

    /// (b) Nothing panics; what is accepted re-renders to the same value, and where it uses
    /// HAMi-core's own forms (no unit, or one letter `k`/`m`/`g`) and no trailing whitespace
    /// (which C reads differently by design), C agrees with it.
    #[test]
    fn arbitrary_input_is_safe(s in prop_oneof![any::<String>(), near_miss()]) {
        if let Ok(n) = parse_size(&s) {
            prop_assert_eq!(parse_size(&format!("{n}")).ok(), Some(n));
            let ends_in_space = s.bytes().last().is_some_and(|b| b.is_ascii_whitespace() || b == 0x0b);
            let hami_form = grammar_model(&s).is_some_and(|(_, unit)| {
                matches!(unit.to_ascii_lowercase().as_str(), "" | "k" | "m" | "g")
            });
            if !ends_in_space && hami_form {
                prop_assert_eq!(c_model(&s), Some(n), "C reads {:?} differently", s);
            }
        } else if let Err(e) = parse_size(&s) {
            // The message renders and quotes the input.
            let msg = e.to_string();
            prop_assert!(msg.starts_with(&format!("{s:?} is not a size: ")), "{}", msg);
        }
        if let Ok(p) = parse_percent(&s) {
            prop_assert!(p <= 100);
            prop_assert_eq!(c_model(&s), Some(p), "{:?}", s);
        }
        if let Ok(p) = parse_priority(&s) {
            prop_assert_eq!(s.trim().parse::<i64>().ok(), Some(i64::from(p)), "{:?}", s);
        }
        let _ = parse_percent(&s).map_err(|e| e.to_string());
        let _ = parse_priority(&s).map_err(|e| e.to_string());
    }

    /// Overflow is refused, never wrapped.
    #[test]
    fn overflow_is_refused(v in (u64::MAX >> 10)..=u64::MAX, n in notation(), sfx in prop::sample::select(vec!["g", "M", "k"])) {
        let mult: u64 = match sfx { "g" => 1 << 30, "M" => 1 << 20, _ => 1 << 10 };
        let text = format!("{}{sfx}", render(v, n));
        prop_assert_eq!(parse_size(&text).ok(), v.checked_mul(mult));
    }

    /// Percentages: same number syntax, 0..=100 accepted, above refused.
    #[test]
    fn percent_range(v in 0u64..400, n in notation()) {
        let text = render(v, n);
        prop_assert_eq!(parse_percent(&text).ok(), (v <= 100).then_some(v), "{:?}", text);
    }

    /// Priorities: every i32 in decimal round-trips.
    #[test]
    fn priority_round_trip(p in any::<i32>()) {
        prop_assert_eq!(parse_priority(&format!("{p}")).ok(), Some(p));
        prop_assert_eq!(parse_priority(&format!(" {p}\n")).ok(), Some(p));
    }

    /// (c) Per-device precedence over random environments: device i's limit is decided by the
    /// `_i` value if set, else by the global one if set, else there is none; 0 means none; a
    /// deciding value that does not parse is malformed (never a fallback, never no limit).
    #[test]
    fn per_device_precedence(
        global in prop::option::of(prop_oneof![well_formed().prop_map(|(s, _)| s), near_miss()]),
        per in prop::collection::vec(
            prop::option::of(prop_oneof![well_formed().prop_map(|(s, _)| s), near_miss()]),
            16,
        ),
    ) {
        for (i, p) in per.iter().enumerate() {
            let (got, src) = device_memory_limit(p.as_deref(), global.as_deref());
            let (decider, want_src) = match (p, &global) {
                (Some(v), _) => (Some(v), LimitSource::PerDevice),
                (None, Some(v)) => (Some(v), LimitSource::Global),
                (None, None) => (None, LimitSource::Default),
            };
            let want = match decider.map(|v| grammar_model(v).map(|(n, _)| n)) {
                None | Some(Some(0)) => MemLimit::Unlimited,
                Some(Some(n)) => MemLimit::Bytes(n),
                Some(None) => MemLimit::Malformed,
            };
            prop_assert_eq!(got, want, "device {}", i);
            prop_assert_eq!(src, want_src);

            let (sm, _) = device_sm_limit(p.as_deref(), global.as_deref());
            let pd = p.as_deref().and_then(|v| parse_percent(v).ok());
            let gl = global.as_deref().and_then(|v| parse_percent(v).ok());
            let want = pd.or(gl).filter(|&v| v != 0).unwrap_or(100);
            prop_assert_eq!(sm, want, "device {}", i);
        }
    }
}

#[test]
fn documented_examples() {
    const G: u64 = 1 << 30;
    const M: u64 = 1 << 20;
    for (s, v) in [
        ("1073741824", G),
        ("1g", G),
        ("1024m", G),
        ("512K", 512 << 10),
        ("0x40000000", G),
        ("0x10m", 16 * M),
        ("010m", 8 * M),
    ] {
        assert_eq!(parse_size(s), Ok(v), "{s}");
        assert_eq!(c_model(s), Some(v), "{s}");
    }
    // What C misreads as bytes and we read as meant, 1024-based.
    for (s, v, c) in [
        ("1gb", G, 1),
        ("1GB", G, 1),
        ("1Gi", G, 1),
        ("1GiB", G, 1),
        ("1024MiB", G, 1024),
        ("1tb", 1 << 40, 1),
    ] {
        assert_eq!(parse_size(s), Ok(v), "{s}");
        assert_eq!(c_model(s), Some(c), "{s}");
    }
    // What C misreads and we refuse, with what C would have done.
    for (s, c) in [
        ("1gbx", Some(1)),
        ("lots", Some(0)),
        ("1.5g", Some(G)),
        ("-1", Some(u64::MAX)),
        ("08", Some(0)),
        ("0x", Some(0)),
        ("", Some(0)),
        ("12abc", Some(12)),
    ] {
        assert!(parse_size(s).is_err(), "{s}");
        assert_eq!(c_model(s), c, "{s}");
    }
}

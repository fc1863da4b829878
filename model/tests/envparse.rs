//! Property tests of `hami_shm::envparse` against an independent model of HAMi-core's C parser
//! (`strtoul(s, &end, 0)` plus a multiplier chosen by the string's last character).
#![cfg(not(any(loom, shuttle)))]

use hami_shm::envparse::{
    device_memory_limit, device_sm_limit, parse_percent, parse_priority, parse_size, LimitSource,
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
    "[ \t0-9xXa-fgGmMkKiIbB+.%-]{0,14}"
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// (a) Every well-formed input means what HAMi-core's C parser makes of it.
    #[test]
    fn agrees_with_c_on_well_formed_input((text, value) in well_formed()) {
        prop_assert_eq!(c_model(&text), Some(value), "model sanity for {:?}", text);
        prop_assert_eq!(parse_size(&text), Ok(value), "{:?}", text);
    }

    /// (b) Nothing panics; what is accepted re-renders to the same value, and (with no trailing
    /// whitespace, which C reads differently by design) C agrees with it.
    #[test]
    fn arbitrary_input_is_safe(s in prop_oneof![any::<String>(), near_miss()]) {
        if let Ok(n) = parse_size(&s) {
            prop_assert_eq!(parse_size(&format!("{n}")).ok(), Some(n));
            let ends_in_space = s.bytes().last().is_some_and(|b| b.is_ascii_whitespace() || b == 0x0b);
            if !ends_in_space {
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

    /// (c) Per-device precedence over random environments: device i's limit is the `_i` value
    /// if well-formed, else the global if well-formed, else none; 0 means none.
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
            let pd = p.as_deref().and_then(|v| parse_size(v).ok());
            let gl = global.as_deref().and_then(|v| parse_size(v).ok());
            let (want, want_src) = match (pd, gl) {
                (Some(v), _) => (v, LimitSource::PerDevice),
                (None, Some(v)) => (v, LimitSource::Global),
                (None, None) => (0, LimitSource::Default),
            };
            prop_assert_eq!(got, (want != 0).then_some(want), "device {}", i);
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
    // What C misreads and we refuse, with what C would have done.
    for (s, c) in [
        ("1gb", Some(1)),
        ("1Gi", Some(1)),
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

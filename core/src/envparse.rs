//! HAMi-core's number syntax for limits, read strictly, plus the unit spellings people write.
//!
//! HAMi-core reads `CUDA_DEVICE_MEMORY_LIMIT[_<i>]` and `CUDA_DEVICE_SM_LIMIT[_<i>]` with
//! `strtoul(s, &end, 0)` and then looks at the *last character* of the string for a `G`/`g`, `M`/`m`
//! or `K`/`k` multiplier (2³⁰, 2²⁰, 2¹⁰). Every value it reads correctly means the same here:
//!
//! | text          | value                           |
//! |---------------|---------------------------------|
//! | `1073741824`  | 1 GiB (decimal bytes)           |
//! | `1g`, `1G`    | 1 GiB                           |
//! | `1024m`       | 1 GiB                           |
//! | `512K`        | 512 KiB                         |
//! | `0x40000000`  | 1 GiB (hexadecimal, `0x`/`0X`)  |
//! | `0x10m`       | 16 MiB                          |
//! | `010m`        | **8 MiB**: a leading `0` means octal, exactly as `strtoul` with base 0 reads it |
//!
//! A size may also carry the longer unit spellings of Kubernetes and of everyday use, which the
//! C code misreads as bytes (`1gb` is 1 byte there): the unit letter `k`, `m`, `g` or `t` in
//! either case, alone or followed by `b`, `i` or `ib` in any case. So `1gb`, `1GB`, `1GiB`, `1Gi`,
//! `1G`, `1024MiB`, `512Mi`, `1tb`, `1kb`, `1KiB` are all accepted, and **every unit is 1024-based**
//! (`1GB` is 2³⁰ bytes, not 10⁹), as HAMi-core's `g`/`m`/`k` are: one meaning per letter, whatever
//! follows it. After a `0x` number a bare `b` is a hex digit (`0x1b` is 27 bytes), as in C.
//!
//! Everything else is refused with a [`ParseError`] that says why and what to write instead: an
//! empty value, a sign (`-1` would be `ULONG_MAX` in C), an unknown suffix or trailing junk
//! (`1gbx`, `lots`, `12abc`; `1.5g` would be 1 GiB in C), a space before the unit, bad digits
//! (`0x`, `08`) and overflow (of the number or after the multiplier, which C turns into 0, i.e.
//! no limit).
//!
//! Leading and trailing ASCII whitespace (C's `isspace` set) is trimmed. One deliberate difference
//! from the C code: it only sees a suffix in the last character, so `"1g "` is 1 byte there; here
//! trailing whitespace is trimmed first, so `"1g "` is 1 GiB.
//!
//! Everything here is `no_std` without `alloc`: errors borrow the input and record byte offsets
//! into it, so a caller that owns the text can rebuild the error later with
//! [`ParseError::from_parts`].

use core::fmt;

/// What the text was supposed to be; it picks the wording of an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Expected {
    /// A byte count with an optional unit such as `g`, `GiB` or `mb` ([`parse_size`]).
    Size,
    /// An SM percentage, 0 to 100, no suffix ([`parse_percent`]).
    Percent,
    /// A decimal task priority, possibly negative ([`parse_priority`]).
    Priority,
}

/// Why a value was refused. Offsets are byte offsets into the *original* (untrimmed) input.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Problem {
    /// Nothing but whitespace. C would read 0, i.e. no limit.
    Empty,
    /// A leading `+` or `-` at the given offset (sizes and percentages only). C would wrap `-1` to
    /// `ULONG_MAX`.
    Sign {
        /// Offset of the sign character.
        at: usize,
    },
    /// No number at all (`g`, `abc`, `-`).
    NoDigits,
    /// `0x` with no hexadecimal digit after it. C would read the `0` and stop.
    NoHexDigits,
    /// A leading `0` made the number octal and an `8` or `9` follows at the given offset. C would
    /// stop at that digit.
    OctalDigit {
        /// Offset of the offending digit.
        at: usize,
    },
    /// A decimal point at the given offset (`1.5g`). C would drop the fraction.
    Fraction {
        /// Offset of the `.`.
        at: usize,
    },
    /// Whitespace between the number (ending at `digits_end`) and a valid unit starting at
    /// `suffix_at` (`4 g`, `4 GiB`).
    SpaceBeforeSuffix {
        /// Offset just past the last digit.
        digits_end: usize,
        /// Offset of the unit's first character.
        suffix_at: usize,
    },
    /// Text after the number that is not a valid unit, from `at` to the end of the trimmed
    /// input (`1gbx`, `12abc`, `50%`). C would ignore it, or take it to mean bytes.
    Trailing {
        /// Offset of the first unexpected character.
        at: usize,
        /// Offset just past the last non-whitespace character.
        end: usize,
    },
    /// The number, or the number times its multiplier, does not fit (u64 for sizes and
    /// percentages, i32 for priorities). C would saturate or turn it into 0.
    Overflow,
    /// A percentage above 100.
    AboveHundred {
        /// The value read.
        value: u64,
    },
}

/// A refused value: the text, what it should have been, and why not. `Display` gives one clear
/// sentence with a suggestion, e.g. `"1gbx" is not a size: unknown suffix "gbx"; write a whole
/// number of bytes, or one with a unit: 4g, 4GiB, 4096m, 512Ki (units k, m, g, t; 1024-based)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParseError<'a> {
    input: &'a str,
    expected: Expected,
    problem: Problem,
}

/// The error of [`parse_size`]; the same type serves percentages and priorities.
pub type SizeError<'a> = ParseError<'a>;

impl<'a> ParseError<'a> {
    /// Rebuilds an error from its parts, for a caller that stored the owned text and the
    /// [`Problem`] and wants the message again. Offsets that do not fit `input` are tolerated
    /// (the message then quotes less), never a panic.
    pub fn from_parts(input: &'a str, expected: Expected, problem: Problem) -> Self {
        Self {
            input,
            expected,
            problem,
        }
    }

    /// The text as given, so the message can quote it.
    pub fn input(&self) -> &'a str {
        self.input
    }

    /// What the text should have been, so callers can word their own context.
    pub fn expected(&self) -> Expected {
        self.expected
    }

    /// Why the text was refused, for callers that match on the reason (and for tests).
    pub fn problem(&self) -> Problem {
        self.problem
    }

    fn slice(&self, from: usize, to: usize) -> &'a str {
        self.input.get(from..to).unwrap_or("")
    }
}

const SIZE_FORMS: &str = "write a whole number of bytes, or one with a unit: 4g, 4GiB, 4096m, \
                          512Ki (units k, m, g, t; 1024-based)";
const PERCENT_FORMS: &str = "write a whole number from 0 to 100 (0 and 100 both mean no limit)";
const PRIORITY_FORMS: &str = "write a whole decimal number such as 0 or 1 (the default)";

impl fmt::Display for ParseError<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (noun, forms) = match self.expected {
            Expected::Size => ("a size", SIZE_FORMS),
            Expected::Percent => ("a percentage", PERCENT_FORMS),
            Expected::Priority => ("a priority", PRIORITY_FORMS),
        };
        write!(f, "{:?} is not {}: ", self.input, noun)?;
        match self.problem {
            Problem::Empty => write!(f, "the value is empty; {forms}"),
            Problem::Sign { at } => {
                let sign = self.slice(at, at + 1);
                match (self.expected, sign) {
                    (Expected::Size, "-") => write!(
                        f,
                        "a size cannot be negative (C HAMi-core reads -1 as 18446744073709551615 \
                         bytes); {forms}"
                    ),
                    _ => write!(
                        f,
                        "a sign is not allowed; write the number without {sign:?}"
                    ),
                }
            }
            Problem::NoDigits => write!(f, "there is no number; {forms}"),
            Problem::NoHexDigits => write!(f, "no hexadecimal digit follows \"0x\"; {forms}"),
            Problem::OctalDigit { at } => write!(
                f,
                "a leading 0 makes the number octal (as C's strtoul reads it) and {:?} is not an \
                 octal digit; write the number without the leading 0",
                self.slice(at, at + 1)
            ),
            Problem::Fraction { .. } => match self.expected {
                Expected::Size => write!(
                    f,
                    "fractions are not supported (C HAMi-core drops them: 1.5g is 1g); write a \
                     whole number of a smaller unit, e.g. 1536m for 1.5 GiB"
                ),
                _ => write!(f, "fractions are not supported; {forms}"),
            },
            Problem::SpaceBeforeSuffix {
                digits_end,
                suffix_at,
            } => {
                let (start, end) = trimmed_range(self.input);
                write!(
                    f,
                    "a space separates the number from its unit; write {}{}",
                    self.slice(start, digits_end),
                    self.slice(suffix_at, end)
                )
            }
            Problem::Trailing { at, end } => {
                let junk = self.slice(at, end);
                match self.expected {
                    Expected::Size => write!(f, "unknown suffix {junk:?}; {forms}"),
                    Expected::Percent if junk == "%" => write!(
                        f,
                        "the \"%\" is implied; write {}",
                        self.slice(trimmed_range(self.input).0, at)
                    ),
                    _ => write!(f, "unexpected {junk:?} after the number; {forms}"),
                }
            }
            Problem::Overflow => match self.expected {
                Expected::Size => write!(
                    f,
                    "it is larger than 18446744073709551615 bytes (16 EiB); write a smaller size"
                ),
                Expected::Percent => write!(f, "the number is far too large; {forms}"),
                Expected::Priority => write!(f, "it is outside -2147483648..=2147483647; {forms}"),
            },
            Problem::AboveHundred { value } => {
                write!(f, "{value} is more than 100 percent; {forms}")
            }
        }
    }
}

/// C's `isspace` in the "C" locale: what `strtoul` skips, and what we trim from both ends.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\x0b' | b'\x0c' | b'\r')
}

/// The trimmed text as a byte range of `s`.
fn trimmed_range(s: &str) -> (usize, usize) {
    let b = s.as_bytes();
    let start = b.iter().take_while(|&&c| is_c_space(c)).count();
    let end = b.len()
        - b[start..]
            .iter()
            .rev()
            .take_while(|&&c| is_c_space(c))
            .count();
    (start, end)
}

/// The unsigned number (no sign allowed) that the trimmed `s` starts with, as [`scan_unsigned`]
/// reads it, and where the trimmed text ends: `(value, digits_end, end)`. An empty text is an
/// error.
fn leading_unsigned(
    s: &str,
    expected: Expected,
) -> Result<(Option<u64>, usize, usize), ParseError<'_>> {
    let err = |problem| ParseError::from_parts(s, expected, problem);
    let (start, end) = trimmed_range(s);
    if start == end {
        return Err(err(Problem::Empty));
    }
    if matches!(s.as_bytes()[start], b'+' | b'-') {
        return Err(err(Problem::Sign { at: start }));
    }
    let (value, digits_end) = scan_unsigned(s, start, end, expected)?;
    Ok((value, digits_end, end))
}

/// Nothing may follow a number's digits (ending at `digits_end`) in the trimmed text (ending at
/// `end`): a `.` is a fraction, anything else trailing junk.
fn nothing_after(
    s: &str,
    expected: Expected,
    digits_end: usize,
    end: usize,
) -> Result<(), ParseError<'_>> {
    if digits_end == end {
        return Ok(());
    }
    let problem = if s.as_bytes()[digits_end] == b'.' {
        Problem::Fraction { at: digits_end }
    } else {
        Problem::Trailing {
            at: digits_end,
            end,
        }
    };
    Err(ParseError::from_parts(s, expected, problem))
}

/// A number in `strtoul` base-0 notation read from the start of `s[start..end]`: its value (None
/// on overflow) and the offset just past its digits.
fn scan_unsigned(
    s: &str,
    start: usize,
    end: usize,
    expected: Expected,
) -> Result<(Option<u64>, usize), ParseError<'_>> {
    let b = &s.as_bytes()[..end];
    let err = |problem| ParseError::from_parts(s, expected, problem);
    let (radix, digits_start) = match b.get(start..start + 2) {
        Some([b'0', b'x' | b'X']) => (16, start + 2),
        _ if b[start] == b'0' => (8, start + 1),
        _ if b[start].is_ascii_digit() => (10, start),
        _ if b[start] == b'.' => return Err(err(Problem::Fraction { at: start })),
        _ => return Err(err(Problem::NoDigits)),
    };
    let mut value = Some(0u64);
    let mut i = digits_start;
    while i < end {
        let Some(d) = (b[i] as char).to_digit(radix) else {
            break;
        };
        value = value
            .and_then(|v| v.checked_mul(u64::from(radix)))
            .and_then(|v| v.checked_add(u64::from(d)));
        i += 1;
    }
    if radix == 16 && i == digits_start {
        return Err(err(Problem::NoHexDigits));
    }
    if radix == 8 && i < end && matches!(b[i], b'8' | b'9') {
        return Err(err(Problem::OctalDigit { at: i }));
    }
    Ok((value, i))
}

/// The multiplier of a unit: `k`, `m`, `g` or `t` in either case, alone or followed by `b`, `i`
/// or `ib` in any case; 1024-based whatever follows the letter (module docs).
fn unit_multiplier(unit: &[u8]) -> Option<u64> {
    let (first, rest) = unit.split_first()?;
    let shift = match first.to_ascii_lowercase() {
        b'k' => 10,
        b'm' => 20,
        b'g' => 30,
        b't' => 40,
        _ => return None,
    };
    let rest_ok = matches!(
        rest,
        [] | [b'b' | b'B'] | [b'i' | b'I'] | [b'i' | b'I', b'b' | b'B']
    );
    rest_ok.then_some(1u64 << shift)
}

/// Parses a byte count: `strtoul` base-0 notation as HAMi-core reads it (decimal, `0x`
/// hexadecimal, leading-`0` octal) and an optional unit (`g`, `GiB`, `mb`, `Ti`, ...; see the
/// module docs), all 1024-based. Whatever the C code would misread is an error.
pub fn parse_size(s: &str) -> Result<u64, SizeError<'_>> {
    let err = |problem| ParseError::from_parts(s, Expected::Size, problem);
    let (value, digits_end, end) = leading_unsigned(s, Expected::Size)?;
    let b = s.as_bytes();
    let multiplier = if digits_end == end {
        1
    } else if let Some(m) = unit_multiplier(&b[digits_end..end]) {
        m
    } else if b[digits_end] == b'.' {
        return Err(err(Problem::Fraction { at: digits_end }));
    } else {
        let suffix_at = digits_end
            + b[digits_end..end]
                .iter()
                .take_while(|&&c| is_c_space(c))
                .count();
        if suffix_at > digits_end && unit_multiplier(&b[suffix_at..end]).is_some() {
            return Err(err(Problem::SpaceBeforeSuffix {
                digits_end,
                suffix_at,
            }));
        }
        return Err(err(Problem::Trailing {
            at: digits_end,
            end,
        }));
    };
    value
        .and_then(|v| v.checked_mul(multiplier))
        .ok_or(err(Problem::Overflow))
}

/// Parses an SM-utilisation percentage: the number syntax of [`parse_size`] (decimal, hex,
/// leading-`0` octal) without a suffix, in `0..=100`. What 0 means is the caller's business
/// (HAMi-core treats an unset or 0 global limit as 100).
pub fn parse_percent(s: &str) -> Result<u64, ParseError<'_>> {
    let err = |problem| ParseError::from_parts(s, Expected::Percent, problem);
    let (value, digits_end, end) = leading_unsigned(s, Expected::Percent)?;
    nothing_after(s, Expected::Percent, digits_end, end)?;
    match value {
        None => Err(err(Problem::Overflow)),
        Some(v) if v > 100 => Err(err(Problem::AboveHundred { value: v })),
        Some(v) => Ok(v),
    }
}

/// Parses a task priority (`CUDA_TASK_PRIORITY`): a decimal integer with an optional sign, in
/// i32 range. Unlike C's `atoi`, junk, hex and overflow are errors rather than 0 or garbage.
pub fn parse_priority(s: &str) -> Result<i32, ParseError<'_>> {
    let err = |problem| ParseError::from_parts(s, Expected::Priority, problem);
    let (start, end) = trimmed_range(s);
    if start == end {
        return Err(err(Problem::Empty));
    }
    let b = s.as_bytes();
    let negative = b[start] == b'-';
    let digits_start = if matches!(b[start], b'+' | b'-') {
        start + 1
    } else {
        start
    };
    let digits_end = digits_start
        + b[digits_start..end]
            .iter()
            .take_while(|c| c.is_ascii_digit())
            .count();
    if digits_end == digits_start {
        if digits_start < end && b[digits_start] == b'.' {
            return Err(err(Problem::Fraction { at: digits_start }));
        }
        return Err(err(Problem::NoDigits));
    }
    nothing_after(s, Expected::Priority, digits_end, end)?;
    // Accumulate towards the sign so that i32::MIN is representable.
    let mut value: i32 = 0;
    for &c in &b[digits_start..digits_end] {
        let d = i32::from(c - b'0');
        value = value
            .checked_mul(10)
            .and_then(|v| {
                if negative {
                    v.checked_sub(d)
                } else {
                    v.checked_add(d)
                }
            })
            .ok_or(err(Problem::Overflow))?;
    }
    Ok(value)
}

/// Where a device's limit came from under HAMi-core's rule "`X_<i>` wins over `X`".
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LimitSource {
    /// The per-device variable (`CUDA_DEVICE_MEMORY_LIMIT_<i>`, `CUDA_DEVICE_SM_LIMIT_<i>`).
    PerDevice,
    /// The global variable.
    Global,
    /// No variable decided: the default applies.
    Default,
}

/// One device's memory limit as configured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemLimit {
    /// No limit: nothing set, or 0 (HAMi-core's "no limit").
    Unlimited,
    /// At most this many bytes (never 0).
    Bytes(u64),
    /// The deciding variable is malformed. The caller must give the process no GPU memory, never
    /// no limit: a typo must not lift a limit the operator meant to set.
    Malformed,
}

/// One device's memory limit from the texts of its per-device and global variables, the single
/// place that states the precedence: the per-device variable decides when it is set, else the
/// global one when it is set, else there is no limit. A set variable decides even when it is
/// malformed ([`MemLimit::Malformed`]): falling back to another variable would turn a typo into a
/// different limit, or into none. 0 means no limit, as in HAMi-core. Returns the limit and which
/// variable decided.
pub fn device_memory_limit(
    per_device: Option<&str>,
    global: Option<&str>,
) -> (MemLimit, LimitSource) {
    let (text, src) = match (per_device, global) {
        (Some(v), _) => (v, LimitSource::PerDevice),
        (None, Some(v)) => (v, LimitSource::Global),
        (None, None) => return (MemLimit::Unlimited, LimitSource::Default),
    };
    let limit = match parse_size(text) {
        Ok(0) => MemLimit::Unlimited,
        Ok(n) => MemLimit::Bytes(n),
        Err(_) => MemLimit::Malformed,
    };
    (limit, src)
}

/// One device's SM limit in percent: a well-formed per-device value wins, else a well-formed
/// global one, else 100. Unlike memory, a malformed value counts as unset: the SM limit shares
/// time, it cannot make the GPU's memory run out, and there is no "no SM" to fail closed to. 0
/// means no limit (100), for the global variable as in HAMi-core and, since a 0 % limit would
/// stall every kernel, for the per-device one too.
pub fn device_sm_limit(per_device: Option<&str>, global: Option<&str>) -> (u64, LimitSource) {
    let (v, src) = match (
        per_device.and_then(|v| parse_percent(v).ok()),
        global.and_then(|v| parse_percent(v).ok()),
    ) {
        (Some(v), _) => (v, LimitSource::PerDevice),
        (None, Some(v)) => (v, LimitSource::Global),
        (None, None) => (100, LimitSource::Default),
    };
    (if v == 0 { 100 } else { v }, src)
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 1 << 30;
    const M: u64 = 1 << 20;
    const K: u64 = 1 << 10;

    /// Renders an error into a fixed buffer (no alloc in this crate).
    struct Buf {
        b: [u8; 512],
        n: usize,
    }
    impl fmt::Write for Buf {
        fn write_str(&mut self, s: &str) -> fmt::Result {
            let end = self.n + s.len();
            self.b
                .get_mut(self.n..end)
                .ok_or(fmt::Error)?
                .copy_from_slice(s.as_bytes());
            self.n = end;
            Ok(())
        }
    }
    fn render(e: &ParseError<'_>) -> Buf {
        let mut buf = Buf { b: [0; 512], n: 0 };
        fmt::write(&mut buf, format_args!("{e}")).unwrap();
        buf
    }
    fn text(b: &Buf) -> &str {
        core::str::from_utf8(&b.b[..b.n]).unwrap()
    }

    #[test]
    fn envparse_accepts_hami_forms() {
        let ok: &[(&str, u64)] = &[
            ("1073741824", G),
            ("1g", G),
            ("1G", G),
            ("1024m", G),
            ("1024M", G),
            ("512K", 512 * K),
            ("512k", 512 * K),
            ("0x40000000", G),
            ("0X40000000", G),
            ("0x10m", 16 * M),
            ("0x1b", 27),
            ("0xFFk", 255 * K),
            ("010m", 8 * M),
            ("010", 8),
            ("0", 0),
            ("00", 0),
            ("0g", 0),
            ("0x0", 0),
            ("  4g\t\n", 4 * G),
            ("\x0b7", 7),
            ("18446744073709551615", u64::MAX),
            ("0xffffffffffffffff", u64::MAX),
            ("17179869183g", 17_179_869_183 * G),
            // The unit spellings people write, all 1024-based.
            ("1gb", G),
            ("1GB", G),
            ("1GiB", G),
            ("1gib", G),
            ("1Gi", G),
            ("1024MiB", G),
            ("1024mb", G),
            ("512Mi", 512 * M),
            ("1tb", 1 << 40),
            ("1T", 1 << 40),
            ("1TiB", 1 << 40),
            ("1k", K),
            ("1kb", K),
            ("1KiB", K),
            ("1Ki", K),
            ("0x10MiB", 16 * M),
            ("010GiB", 8 * G),
            (" 2GiB\n", 2 * G),
            ("16777215t", 16_777_215 << 40),
        ];
        for &(s, v) in ok {
            assert_eq!(parse_size(s), Ok(v), "{s:?}");
        }
    }

    #[test]
    fn envparse_refuses_what_c_misreads() {
        let bad: &[(&str, Problem)] = &[
            ("", Problem::Empty),
            ("  ", Problem::Empty),
            ("-1", Problem::Sign { at: 0 }),
            ("+1", Problem::Sign { at: 0 }),
            (" -1g", Problem::Sign { at: 1 }),
            ("1gbx", Problem::Trailing { at: 1, end: 4 }),
            ("1bg", Problem::Trailing { at: 1, end: 3 }),
            ("1gi b", Problem::Trailing { at: 1, end: 5 }),
            ("1GiBs", Problem::Trailing { at: 1, end: 5 }),
            ("1gg", Problem::Trailing { at: 1, end: 3 }),
            ("1b", Problem::Trailing { at: 1, end: 2 }),
            ("1p", Problem::Trailing { at: 1, end: 2 }),
            ("12abc", Problem::Trailing { at: 2, end: 5 }),
            ("lots", Problem::NoDigits),
            ("1.5g", Problem::Fraction { at: 1 }),
            (".5g", Problem::Fraction { at: 0 }),
            (
                "4 g",
                Problem::SpaceBeforeSuffix {
                    digits_end: 1,
                    suffix_at: 2,
                },
            ),
            (
                "1 GiB",
                Problem::SpaceBeforeSuffix {
                    digits_end: 1,
                    suffix_at: 2,
                },
            ),
            ("4 5", Problem::Trailing { at: 1, end: 3 }),
            ("4 gx", Problem::Trailing { at: 1, end: 4 }),
            ("0x", Problem::NoHexDigits),
            ("0xg", Problem::NoHexDigits),
            ("0xz", Problem::NoHexDigits),
            ("08", Problem::OctalDigit { at: 1 }),
            ("0719", Problem::OctalDigit { at: 3 }),
            ("g", Problem::NoDigits),
            ("abc", Problem::NoDigits),
            ("18446744073709551616", Problem::Overflow),
            ("0x10000000000000000", Problem::Overflow),
            ("17179869184g", Problem::Overflow),
            ("16777216TiB", Problem::Overflow),
            ("99999999999999999999999gb", Problem::Overflow),
            (
                "99999999999999999999999gbx",
                Problem::Trailing { at: 23, end: 26 },
            ),
        ];
        for &(s, p) in bad {
            let e = parse_size(s).expect_err(s);
            assert_eq!(e.problem(), p, "{s:?}");
            assert_eq!(e.input(), s);
            assert_eq!(e.expected(), Expected::Size);
            // Every message renders and names the input.
            let b = render(&e);
            assert!(text(&b).contains(" is not a size: "), "{}", text(&b));
        }
    }

    #[test]
    fn envparse_messages() {
        let cases: &[(&str, &str)] = &[
            (
                "1gbx",
                "\"1gbx\" is not a size: unknown suffix \"gbx\"; write a whole number of bytes, \
                 or one with a unit: 4g, 4GiB, 4096m, 512Ki (units k, m, g, t; 1024-based)",
            ),
            ("4 g", "\"4 g\" is not a size: a space separates the number from its unit; write 4g"),
            (" 4 GiB ", "\" 4 GiB \" is not a size: a space separates the number from its unit; write 4GiB"),
            ("08", "\"08\" is not a size: a leading 0 makes the number octal (as C's strtoul reads it) and \"8\" is not an octal digit; write the number without the leading 0"),
        ];
        for &(s, want) in cases {
            let b = render(&parse_size(s).unwrap_err());
            assert_eq!(text(&b), want);
        }
        let b = render(&parse_size("-1").unwrap_err());
        assert!(text(&b).contains("cannot be negative"), "{}", text(&b));
        // What 0 means is the caller's business (no memory limit; the default context estimate):
        // no size message may promise it.
        for s in ["-1", "99999999999999999999", "1.5g", "lots", ""] {
            let b = render(&parse_size(s).unwrap_err());
            assert!(!text(&b).contains("no limit"), "{}", text(&b));
        }
        let b = render(&parse_percent("50%").unwrap_err());
        assert_eq!(
            text(&b),
            "\"50%\" is not a percentage: the \"%\" is implied; write 50"
        );
        let b = render(&parse_percent("150").unwrap_err());
        assert!(text(&b).contains("150 is more than 100 percent"));
        let b = render(&parse_priority("high").unwrap_err());
        assert!(text(&b).starts_with("\"high\" is not a priority: "));
    }

    #[test]
    fn envparse_from_parts_tolerates_bad_offsets() {
        let e = ParseError::from_parts("é", Expected::Size, Problem::Trailing { at: 1, end: 99 });
        let b = render(&e);
        assert!(text(&b).contains("unknown suffix \"\""));
    }

    #[test]
    fn envparse_percent() {
        for (s, v) in [
            ("0", 0),
            ("50", 50),
            ("100", 100),
            ("0x64", 100),
            ("010", 8),
            (" 25 ", 25),
        ] {
            assert_eq!(parse_percent(s), Ok(v), "{s:?}");
        }
        for (s, p) in [
            ("101", Problem::AboveHundred { value: 101 }),
            ("-5", Problem::Sign { at: 0 }),
            ("50g", Problem::Trailing { at: 2, end: 3 }),
            ("50%", Problem::Trailing { at: 2, end: 3 }),
            ("12.5", Problem::Fraction { at: 2 }),
            ("", Problem::Empty),
            ("09", Problem::OctalDigit { at: 1 }),
            ("99999999999999999999", Problem::Overflow),
        ] {
            assert_eq!(parse_percent(s).unwrap_err().problem(), p, "{s:?}");
        }
    }

    #[test]
    fn envparse_priority() {
        for (s, v) in [
            ("1", 1),
            ("0", 0),
            ("-3", -3),
            ("+7", 7),
            (" 01 ", 1),
            ("2147483647", i32::MAX),
            ("-2147483648", i32::MIN),
        ] {
            assert_eq!(parse_priority(s), Ok(v), "{s:?}");
        }
        for (s, p) in [
            ("", Problem::Empty),
            ("-", Problem::NoDigits),
            ("high", Problem::NoDigits),
            ("0x1", Problem::Trailing { at: 1, end: 3 }),
            ("1.0", Problem::Fraction { at: 1 }),
            ("2147483648", Problem::Overflow),
            ("-2147483649", Problem::Overflow),
        ] {
            assert_eq!(parse_priority(s).unwrap_err().problem(), p, "{s:?}");
        }
    }

    #[test]
    fn envparse_device_precedence() {
        use LimitSource::*;
        use MemLimit::*;
        assert_eq!(device_memory_limit(None, None), (Unlimited, Default));
        assert_eq!(device_memory_limit(None, Some("1g")), (Bytes(G), Global));
        assert_eq!(
            device_memory_limit(Some("2g"), Some("1g")),
            (Bytes(2 * G), PerDevice)
        );
        assert_eq!(
            device_memory_limit(Some("0"), Some("1g")),
            (Unlimited, PerDevice)
        );
        // A malformed variable that decides is malformed, never a fallback or no limit.
        assert_eq!(
            device_memory_limit(Some("2gbx"), Some("1g")),
            (Malformed, PerDevice)
        );
        assert_eq!(
            device_memory_limit(Some("2g"), Some("1gbx")),
            (Bytes(2 * G), PerDevice)
        );
        assert_eq!(device_memory_limit(None, Some("-1")), (Malformed, Global));
        assert_eq!(device_memory_limit(None, Some("")), (Malformed, Global));
        assert_eq!(device_memory_limit(Some(""), None), (Malformed, PerDevice));
        assert_eq!(device_memory_limit(None, Some("0")), (Unlimited, Global));
        assert_eq!(device_sm_limit(None, None), (100, Default));
        assert_eq!(device_sm_limit(None, Some("0")), (100, Global));
        assert_eq!(device_sm_limit(Some("30"), Some("50")), (30, PerDevice));
        assert_eq!(device_sm_limit(Some("0"), Some("50")), (100, PerDevice));
        assert_eq!(device_sm_limit(Some("150"), Some("50")), (50, Global));
        assert_eq!(device_sm_limit(Some("150"), None), (100, Default));
    }
}

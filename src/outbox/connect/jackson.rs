//! JSON as Jackson 2 reads and writes it for Kafka Connect: `ObjectMapper.readTree`'s node
//! types (which decide the Connect schema of an expanded payload) and `UTF8JsonGenerator`'s
//! output with its default features (which decides the bytes).
//!
//! Reading, as `readTree` does with default features:
//! - an integer literal is an `int` when it fits 32 bits, a `long` when it fits 64, else a
//!   `BigInteger`; any literal with a fraction or an exponent is a `double`;
//! - a repeated object key keeps its first position and takes the last value;
//! - only the first value is read: what follows it is not looked at.
//!
//! Writing, as `UTF8JsonGenerator` does: no spaces; in strings `"` and `\` escaped, control
//! characters as `\b \t \n \f \r` or `\u00XX`, every character outside the Basic Multilingual
//! Plane as its two surrogates `\uXXXX\uXXXX` (upper-case hex), everything else as UTF-8; a
//! `double` as Java's `Double.toString` prints it (`1.0E-7`, `100.0`).

/// A parsed JSON value, typed as Jackson's tree model types it.
#[derive(Debug, Clone, PartialEq)]
pub enum Node {
    /// `null`.
    Null,
    /// `true` / `false`.
    Bool(bool),
    /// An integer that fits 32 bits (`IntNode`).
    Int(i32),
    /// An integer that fits 64 bits but not 32 (`LongNode`).
    Long(i64),
    /// A larger integer (`BigIntegerNode`), as written.
    BigInt(String),
    /// A number with a fraction or exponent (`DoubleNode`).
    Double(f64),
    /// A string.
    Str(String),
    /// An array.
    Array(Vec<Node>),
    /// An object, keys in first-seen order.
    Object(Vec<(String, Node)>),
}

/// Jackson's default limit on nesting (`StreamReadConstraints`).
const MAX_DEPTH: usize = 1000;
/// Jackson's default limit on a number's length.
const MAX_NUMBER_LENGTH: usize = 1000;

/// Reads the first JSON value of `text`, or `None` where Jackson's `readTree` fails.
pub fn read_tree(text: &str) -> Option<Node> {
    let mut p = Parser {
        s: text.as_bytes(),
        at: 0,
    };
    p.value(0)
}

struct Parser<'a> {
    s: &'a [u8],
    at: usize,
}

impl Parser<'_> {
    fn ws(&mut self) {
        while matches!(self.s.get(self.at), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    fn eat(&mut self, b: u8) -> bool {
        self.ws();
        if self.s.get(self.at) == Some(&b) {
            self.at += 1;
            true
        } else {
            false
        }
    }

    fn literal(&mut self, word: &[u8], node: Node) -> Option<Node> {
        if self.s[self.at..].starts_with(word) {
            self.at += word.len();
            Some(node)
        } else {
            None
        }
    }

    fn value(&mut self, depth: usize) -> Option<Node> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.ws();
        match *self.s.get(self.at)? {
            b'{' => {
                self.at += 1;
                let mut fields: Vec<(String, Node)> = Vec::new();
                if self.eat(b'}') {
                    return Some(Node::Object(fields));
                }
                loop {
                    self.ws();
                    if self.s.get(self.at) != Some(&b'"') {
                        return None;
                    }
                    let key = self.string()?;
                    if !self.eat(b':') {
                        return None;
                    }
                    let v = self.value(depth + 1)?;
                    match fields.iter_mut().find(|(k, _)| *k == key) {
                        Some(slot) => slot.1 = v,
                        None => fields.push((key, v)),
                    }
                    if self.eat(b',') {
                        continue;
                    }
                    return self.eat(b'}').then_some(Node::Object(fields));
                }
            }
            b'[' => {
                self.at += 1;
                let mut items = Vec::new();
                if self.eat(b']') {
                    return Some(Node::Array(items));
                }
                loop {
                    items.push(self.value(depth + 1)?);
                    if self.eat(b',') {
                        continue;
                    }
                    return self.eat(b']').then_some(Node::Array(items));
                }
            }
            b'"' => self.string().map(Node::Str),
            b't' => self.literal(b"true", Node::Bool(true)),
            b'f' => self.literal(b"false", Node::Bool(false)),
            b'n' => self.literal(b"null", Node::Null),
            b'-' | b'0'..=b'9' => self.number(),
            _ => None,
        }
    }

    fn number(&mut self) -> Option<Node> {
        let start = self.at;
        let digits = |p: &mut Self| {
            let from = p.at;
            while p.s.get(p.at).is_some_and(u8::is_ascii_digit) {
                p.at += 1;
            }
            p.at - from
        };
        if self.s.get(self.at) == Some(&b'-') {
            self.at += 1;
        }
        let int_start = self.at;
        let n = digits(self);
        if n == 0 || (n > 1 && self.s[int_start] == b'0') {
            return None;
        }
        let mut float = false;
        if self.s.get(self.at) == Some(&b'.') {
            self.at += 1;
            if digits(self) == 0 {
                return None;
            }
            float = true;
        }
        if matches!(self.s.get(self.at), Some(b'e' | b'E')) {
            self.at += 1;
            if matches!(self.s.get(self.at), Some(b'+' | b'-')) {
                self.at += 1;
            }
            if digits(self) == 0 {
                return None;
            }
            float = true;
        }
        let text = std::str::from_utf8(&self.s[start..self.at]).ok()?;
        if text.len() > MAX_NUMBER_LENGTH {
            return None;
        }
        if float {
            return text.parse().ok().map(Node::Double);
        }
        Some(match text.parse::<i64>() {
            Ok(v) => match i32::try_from(v) {
                Ok(i) => Node::Int(i),
                Err(_) => Node::Long(v),
            },
            Err(_) => Node::BigInt(text.to_owned()),
        })
    }

    /// A string; the cursor is on its opening quote.
    fn string(&mut self) -> Option<String> {
        self.at += 1;
        let mut out = String::new();
        loop {
            let start = self.at;
            while let Some(&b) = self.s.get(self.at) {
                if b == b'"' || b == b'\\' || b < 0x20 {
                    break;
                }
                self.at += 1;
            }
            out.push_str(std::str::from_utf8(&self.s[start..self.at]).ok()?);
            match *self.s.get(self.at)? {
                b'"' => {
                    self.at += 1;
                    return Some(out);
                }
                b'\\' => {
                    self.at += 1;
                    let e = *self.s.get(self.at)?;
                    self.at += 1;
                    match e {
                        b'"' => out.push('"'),
                        b'\\' => out.push('\\'),
                        b'/' => out.push('/'),
                        b'b' => out.push('\u{8}'),
                        b'f' => out.push('\u{c}'),
                        b'n' => out.push('\n'),
                        b'r' => out.push('\r'),
                        b't' => out.push('\t'),
                        b'u' => {
                            let hi = self.hex4()?;
                            let c = if (0xD800..0xDC00).contains(&hi)
                                && self.s[self.at..].starts_with(b"\\u")
                            {
                                let save = self.at;
                                self.at += 2;
                                let lo = self.hex4()?;
                                if (0xDC00..0xE000).contains(&lo) {
                                    char::from_u32(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00))
                                } else {
                                    self.at = save;
                                    None
                                }
                            } else {
                                None
                            };
                            // A lone surrogate: Java keeps it; it cannot be held in UTF-8, so
                            // it reads as U+FFFD, which no jsonb text contains.
                            out.push(c.unwrap_or_else(|| {
                                char::from_u32(hi).unwrap_or(char::REPLACEMENT_CHARACTER)
                            }));
                        }
                        _ => return None,
                    }
                }
                _ => return None,
            }
        }
    }

    fn hex4(&mut self) -> Option<u32> {
        let h = self.s.get(self.at..self.at + 4)?;
        let v = u32::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok()?;
        self.at += 4;
        Some(v)
    }
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

/// Appends `s` as a JSON string, escaped as Jackson's `UTF8JsonGenerator` escapes it.
pub fn write_string(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    let mut buf = [0u16; 2];
    for c in s.chars() {
        match c {
            '"' => out.extend_from_slice(b"\\\""),
            '\\' => out.extend_from_slice(b"\\\\"),
            '\u{8}' => out.extend_from_slice(b"\\b"),
            '\t' => out.extend_from_slice(b"\\t"),
            '\n' => out.extend_from_slice(b"\\n"),
            '\u{c}' => out.extend_from_slice(b"\\f"),
            '\r' => out.extend_from_slice(b"\\r"),
            c if (c as u32) < 0x20 || (c as u32) > 0xFFFF => {
                for unit in c.encode_utf16(&mut buf) {
                    out.extend_from_slice(b"\\u");
                    for shift in [12, 8, 4, 0] {
                        out.push(HEX[usize::from(*unit >> shift & 0xF)]);
                    }
                }
            }
            c => {
                let mut b = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut b).as_bytes());
            }
        }
    }
    out.push(b'"');
}

/// `d` as Java's `Double.toString` prints it (JDK 19 and later: the shortest decimal that reads
/// back as `d`): plain notation from 10⁻³ up to 10⁷ (`0.001`, `100.0`), computerized scientific
/// notation outside it (`1.0E-7`, `1.0E7`), always with a digit after the point.
pub fn java_double(d: f64) -> String {
    if d.is_nan() {
        return "NaN".into();
    }
    if d.is_infinite() {
        return if d > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    if d == 0.0 {
        return if d.is_sign_negative() { "-0.0" } else { "0.0" }.into();
    }
    // Rust's `{:e}` prints the shortest digits that read back as `d`: `-1.2345e-7`.
    let sci = format!("{d:e}");
    let (mantissa, exp) = sci.split_once('e').expect("{:e} has an exponent");
    let exp: i32 = exp.parse().expect("a decimal exponent");
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let abs = d.abs();
    if (1e-3..1e7).contains(&abs) {
        if exp >= 0 {
            let int_len = exp as usize + 1;
            let (int, frac) = if digits.len() > int_len {
                (digits[..int_len].to_owned(), digits[int_len..].to_owned())
            } else {
                (
                    format!("{digits}{}", "0".repeat(int_len - digits.len())),
                    "0".to_owned(),
                )
            };
            format!("{sign}{int}.{frac}")
        } else {
            let zeros = "0".repeat((-exp - 1) as usize);
            format!("{sign}0.{zeros}{digits}")
        }
    } else {
        let frac = if digits.len() > 1 { &digits[1..] } else { "0" };
        format!("{sign}{}.{frac}E{exp}", &digits[..1])
    }
}

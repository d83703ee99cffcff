//! HPACK (RFC 7541), as much of it as one gRPC answer needs: the broker's header blocks
//! decoded (static and dynamic table, Huffman strings), and the request's few headers
//! encoded as literals that never touch the broker's table.
//!
//! Every bound is checked before memory is used: a block's decoded headers together are at
//! most [`MAX_HEADER_LIST`] bytes, and the dynamic table never grows past the size this
//! client announced (the default, [`TABLE_SIZE`]).

/// Bytes of the dynamic table this client lets the broker use: HTTP/2's default
/// `SETTINGS_HEADER_TABLE_SIZE` (RFC 7540 §6.5.2), which the client never changes.
pub const TABLE_SIZE: usize = 4096;

/// Bound on one header block's decoded names and values (RFC 7540's "header list size",
/// counted without its 32-byte overhead per field). A broker's answer carries a handful of
/// headers and a `grpc-message` of a few hundred bytes; 64 KiB is far above any of them and
/// keeps a hostile peer from growing memory through header blocks.
pub const MAX_HEADER_LIST: usize = 64 * 1024;

/// RFC 7541 §4.1: each table entry counts its name, its value and 32 bytes.
const ENTRY_OVERHEAD: usize = 32;

/// A header block the broker sent that cannot be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HpackError(pub &'static str);

impl std::fmt::Display for HpackError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "bad HPACK header block: {}", self.0)
    }
}

/// One decoded header: name and value as the peer sent them (not necessarily UTF-8).
pub type Field = (Vec<u8>, Vec<u8>);

/// The decoding side of one connection: its dynamic table lives as long as the connection.
#[derive(Debug, Default)]
pub struct Decoder {
    /// Newest first, as RFC 7541 §2.3.3 indexes it.
    table: std::collections::VecDeque<Field>,
    size: usize,
    max_size: Option<usize>,
}

impl Decoder {
    /// Decodes one complete header block (HEADERS plus its CONTINUATIONs).
    pub fn decode(&mut self, mut block: &[u8]) -> Result<Vec<Field>, HpackError> {
        let mut fields = Vec::new();
        let mut total = 0usize;
        let mut first = true;
        while let Some(&b) = block.first() {
            if b & 0x80 != 0 {
                // §6.1 indexed field.
                let index = integer(&mut block, 7)?;
                let field = self.lookup(index)?;
                total = add_field(total, &field)?;
                fields.push(field);
            } else if b & 0xe0 == 0x20 {
                // §6.3 dynamic table size update: only at the start of a block.
                if !first {
                    return Err(HpackError("table size update after a header field"));
                }
                let size = integer(&mut block, 5)?;
                if size > TABLE_SIZE {
                    return Err(HpackError("table size update over the announced size"));
                }
                self.max_size = Some(size);
                self.evict_to(size);
                continue;
            } else {
                // §6.2: with incremental indexing (01), without (0000) or never (0001).
                let (prefix, indexing) = if b & 0xc0 == 0x40 {
                    (6, true)
                } else {
                    (4, false)
                };
                let index = integer(&mut block, prefix)?;
                let name = if index == 0 {
                    string(&mut block)?
                } else {
                    self.lookup(index)?.0
                };
                let value = string(&mut block)?;
                let field = (name, value);
                total = add_field(total, &field)?;
                if indexing {
                    self.insert(field.clone());
                }
                fields.push(field);
            }
            first = false;
        }
        Ok(fields)
    }

    fn lookup(&self, index: usize) -> Result<Field, HpackError> {
        match index {
            0 => Err(HpackError("index 0")),
            i if i <= STATIC.len() => {
                let (name, value) = STATIC[i - 1];
                Ok((name.as_bytes().to_vec(), value.as_bytes().to_vec()))
            }
            i => self
                .table
                .get(i - STATIC.len() - 1)
                .cloned()
                .ok_or(HpackError("index past the tables")),
        }
    }

    fn insert(&mut self, field: Field) {
        let size = field.0.len() + field.1.len() + ENTRY_OVERHEAD;
        let max = self.max_size.unwrap_or(TABLE_SIZE);
        // §4.4: an entry larger than the table empties it and is not added.
        self.evict_to(max.saturating_sub(size));
        if size <= max {
            self.size += size;
            self.table.push_front(field);
        }
    }

    fn evict_to(&mut self, size: usize) {
        while self.size > size {
            match self.table.pop_back() {
                Some((n, v)) => self.size -= n.len() + v.len() + ENTRY_OVERHEAD,
                None => self.size = 0,
            }
        }
    }
}

fn add_field(total: usize, field: &Field) -> Result<usize, HpackError> {
    let total = total + field.0.len() + field.1.len();
    if total > MAX_HEADER_LIST {
        return Err(HpackError("header list over 64 KiB"));
    }
    Ok(total)
}

/// §5.1 integer with an `n`-bit prefix; at most what a `usize` of 32 bits holds.
fn integer(block: &mut &[u8], n: u32) -> Result<usize, HpackError> {
    let (&first, rest) = block.split_first().ok_or(HpackError("truncated integer"))?;
    *block = rest;
    let max = (1usize << n) - 1;
    let mut value = usize::from(first) & max;
    if value < max {
        return Ok(value);
    }
    let mut shift = 0;
    loop {
        let (&b, rest) = block.split_first().ok_or(HpackError("truncated integer"))?;
        *block = rest;
        if shift > 28 {
            return Err(HpackError("integer too large"));
        }
        value += usize::from(b & 0x7f) << shift;
        shift += 7;
        if b & 0x80 == 0 {
            return Ok(value);
        }
    }
}

/// §5.2 string literal, Huffman-coded or raw.
fn string(block: &mut &[u8]) -> Result<Vec<u8>, HpackError> {
    let huffman = block.first().is_some_and(|b| b & 0x80 != 0);
    let len = integer(block, 7)?;
    if len > block.len() {
        return Err(HpackError("string longer than the block"));
    }
    let (raw, rest) = block.split_at(len);
    *block = rest;
    if huffman {
        huffman_decode(raw)
    } else {
        Ok(raw.to_vec())
    }
}

/// The request's header fields, each a §6.2.2 literal without indexing: the broker's
/// table is left untouched, so the client keeps no encoder state. Names from the static
/// table by index where it has them.
pub fn encode(fields: &[(&str, &str)], out: &mut Vec<u8>) {
    for (name, value) in fields {
        match STATIC.iter().position(|(n, _)| n == name) {
            Some(i) => put_integer(out, 0x00, 4, i + 1),
            None => {
                out.push(0x00);
                put_string(out, name);
            }
        }
        put_string(out, value);
    }
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    put_integer(out, 0x00, 7, s.len());
    out.extend_from_slice(s.as_bytes());
}

fn put_integer(out: &mut Vec<u8>, flags: u8, n: u32, mut value: usize) {
    let max = (1usize << n) - 1;
    if value < max {
        out.push(flags | value as u8);
        return;
    }
    out.push(flags | max as u8);
    value -= max;
    while value >= 0x80 {
        out.push((value & 0x7f) as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// Code lengths of RFC 7541 Appendix B's Huffman code, symbols 0–255 (EOS, 256, is 30 bits
/// of ones). The code is canonical: sorted by (length, symbol), each code is the previous
/// plus one, shifted left by the growth in length; so the lengths alone define it.
const HUFFMAN_LENGTHS: [u8; 256] = [
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 30, 28,
    28, 28, 28, 28, 28, 28, 28, 28, 6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6, 5, 5,
    5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10, 13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7,
    7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6, 15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6,
    6, 5, 6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28, 20, 22, 20, 20, 22, 22, 22, 23, 22,
    23, 23, 23, 23, 23, 24, 23, 24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24, 22,
    21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23, 21, 21, 22, 21, 23, 22, 23, 23, 20,
    22, 22, 22, 23, 22, 22, 23, 26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25, 19,
    21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27, 20, 24, 20, 21, 22, 21, 21, 23, 22,
    22, 25, 25, 24, 24, 26, 23, 26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26,
];

/// Decodes a Huffman string canonically: bit by bit, tracking the first code of the current
/// length and how many symbols come before it. Padding must be at most 7 one-bits (§5.2).
fn huffman_decode(input: &[u8]) -> Result<Vec<u8>, HpackError> {
    let canon = canonical();
    let mut out = Vec::with_capacity(input.len() * 8 / 5);
    let (mut code, mut len) = (0u32, 0usize);
    for &byte in input {
        for bit in (0..8).rev() {
            code = (code << 1) | u32::from((byte >> bit) & 1);
            len += 1;
            if len > 30 {
                return Err(HpackError("Huffman code longer than 30 bits"));
            }
            let (first, before, count) = canon.by_length[len];
            if count > 0 && code >= first && code - first < count {
                let sym = canon.symbols[(before + code - first) as usize];
                out.push(sym);
                code = 0;
                len = 0;
            } else if len == 30 && code == 0x3fff_ffff {
                return Err(HpackError("EOS inside a Huffman string"));
            }
        }
    }
    if len > 7 || code != (1u32 << len) - 1 {
        return Err(HpackError("bad Huffman padding"));
    }
    Ok(out)
}

struct Canonical {
    /// Per length: the first code of that length, the symbols of shorter codes, the count.
    by_length: [(u32, u32, u32); 31],
    /// Symbols sorted by (length, value).
    symbols: [u8; 256],
}

fn canonical() -> Canonical {
    let mut symbols = [0u8; 256];
    let mut by_length = [(0u32, 0u32, 0u32); 31];
    let mut n = 0usize;
    let mut code = 0u32;
    for (len, slot) in by_length.iter_mut().enumerate().skip(1) {
        *slot = (code, n as u32, 0);
        for (sym, _) in HUFFMAN_LENGTHS
            .iter()
            .enumerate()
            .filter(|(_, l)| usize::from(**l) == len)
        {
            symbols[n] = sym as u8;
            n += 1;
            slot.2 += 1;
            code += 1;
        }
        code <<= 1;
    }
    Canonical { by_length, symbols }
}

/// RFC 7541 Appendix A.
const STATIC: [(&str, &str); 61] = [
    (":authority", ""),
    (":method", "GET"),
    (":method", "POST"),
    (":path", "/"),
    (":path", "/index.html"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "200"),
    (":status", "204"),
    (":status", "206"),
    (":status", "304"),
    (":status", "400"),
    (":status", "404"),
    (":status", "500"),
    ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"),
    ("accept-language", ""),
    ("accept-ranges", ""),
    ("accept", ""),
    ("access-control-allow-origin", ""),
    ("age", ""),
    ("allow", ""),
    ("authorization", ""),
    ("cache-control", ""),
    ("content-disposition", ""),
    ("content-encoding", ""),
    ("content-language", ""),
    ("content-length", ""),
    ("content-location", ""),
    ("content-range", ""),
    ("content-type", ""),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("expect", ""),
    ("expires", ""),
    ("from", ""),
    ("host", ""),
    ("if-match", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("if-range", ""),
    ("if-unmodified-since", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("max-forwards", ""),
    ("proxy-authenticate", ""),
    ("proxy-authorization", ""),
    ("range", ""),
    ("referer", ""),
    ("refresh", ""),
    ("retry-after", ""),
    ("server", ""),
    ("set-cookie", ""),
    ("strict-transport-security", ""),
    ("transfer-encoding", ""),
    ("user-agent", ""),
    ("vary", ""),
    ("via", ""),
    ("www-authenticate", ""),
];

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn text(fields: &[Field]) -> Vec<(String, String)> {
        fields
            .iter()
            .map(|(n, v)| {
                (
                    String::from_utf8(n.clone()).unwrap(),
                    String::from_utf8(v.clone()).unwrap(),
                )
            })
            .collect()
    }

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }

    /// RFC 7541 C.3 (raw strings) and C.4 (Huffman): three requests on one connection,
    /// the later ones indexing what the first added to the dynamic table.
    #[test]
    fn rfc_7541_request_examples() {
        for first in [
            "8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
            "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff",
        ] {
            let mut d = Decoder::default();
            assert_eq!(
                text(&d.decode(&hex(first)).unwrap()),
                pairs(&[
                    (":method", "GET"),
                    (":scheme", "http"),
                    (":path", "/"),
                    (":authority", "www.example.com")
                ])
            );
            assert_eq!(d.size, 57);
        }
        let mut d = Decoder::default();
        d.decode(&hex("8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff"))
            .unwrap();
        assert_eq!(
            text(&d.decode(&hex("8286 84be 5886 a8eb 1064 9cbf")).unwrap()),
            pairs(&[
                (":method", "GET"),
                (":scheme", "http"),
                (":path", "/"),
                (":authority", "www.example.com"),
                ("cache-control", "no-cache")
            ])
        );
        assert_eq!(
            text(
                &d.decode(&hex(
                    "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf"
                ))
                .unwrap()
            ),
            pairs(&[
                (":method", "GET"),
                (":scheme", "https"),
                (":path", "/index.html"),
                (":authority", "www.example.com"),
                ("custom-key", "custom-value")
            ])
        );
        assert_eq!(d.size, 164);
    }

    /// An encoder for the tests, from the same canonical code.
    fn huffman_encode(input: &[u8]) -> Vec<u8> {
        let canon = canonical();
        let mut codes = [(0u32, 0u32); 256];
        for len in 1..=30 {
            let (first, before, count) = canon.by_length[len];
            for k in 0..count {
                codes[canon.symbols[(before + k) as usize] as usize] = (first + k, len as u32);
            }
        }
        let (mut acc, mut bits, mut out) = (0u64, 0u32, Vec::new());
        for &b in input {
            let (code, len) = codes[b as usize];
            acc = (acc << len) | u64::from(code);
            bits += len;
            while bits >= 8 {
                out.push((acc >> (bits - 8)) as u8);
                bits -= 8;
            }
        }
        if bits > 0 {
            out.push(((acc << (8 - bits)) as u8) | ((1u8 << (8 - bits)) - 1));
        }
        out
    }

    #[test]
    fn huffman_round_trips_every_byte() {
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(huffman_decode(&huffman_encode(&all)).unwrap(), all);
        // Codes from Appendix B: '0' 00000, 'a' 00011, 'j' 1110100, '\0' 1111111111000.
        assert_eq!(huffman_encode(b"0"), [0x07]);
        assert_eq!(huffman_encode(b"a"), [0x1f]);
        assert_eq!(huffman_encode(b"j"), [0xe9]);
        assert_eq!(huffman_encode(b"\0"), [0xff, 0xc7]);
    }

    #[test]
    fn huffman_refuses_bad_padding_and_eos() {
        // 'a' then a zero bit of padding.
        assert!(huffman_decode(&[0x1e]).is_err());
        // Eight bits of padding: a whole byte of ones after a symbol.
        assert!(huffman_decode(&[0x1f, 0xff]).is_err());
        // EOS itself.
        assert!(huffman_decode(&[0xff, 0xff, 0xff, 0xff]).is_err());
        assert_eq!(huffman_decode(&[]).unwrap(), b"");
    }

    #[test]
    fn encoded_requests_decode_without_touching_the_table() {
        let fields = [
            (":method", "POST"),
            (":path", "/credbroker.v1.TokenService/GetToken"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            ("x-long", &"v".repeat(300)),
        ];
        let mut block = Vec::new();
        encode(&fields, &mut block);
        let mut d = Decoder::default();
        let got = d.decode(&block).unwrap();
        assert_eq!(text(&got), pairs(&fields));
        assert_eq!(d.size, 0);
    }

    #[test]
    fn bounds_and_malformed_blocks() {
        let mut d = Decoder::default();
        // A table size over the default this client announced.
        assert!(d.decode(&hex("3fe2 1f")).is_err());
        assert!(Decoder::default().decode(&hex("3fe1 1f")).is_ok());
        // A size update after a field.
        assert!(d.decode(&hex("82 20")).is_err());
        // Index 0 and an index past both tables.
        assert!(d.decode(&hex("80")).is_err());
        assert!(d.decode(&hex("be")).is_err());
        // Truncated integer and string.
        assert!(d.decode(&hex("ff")).is_err());
        assert!(d.decode(&hex("0085 6162")).is_err());
        // An integer past 32 bits.
        assert!(d.decode(&hex("ff ffffffffff7f")).is_err());
        // A header list over the bound: two 40 KB values.
        let mut block = Vec::new();
        let v = "x".repeat(40_000);
        encode(&[("a", &v), ("b", &v)], &mut block);
        assert_eq!(
            d.decode(&block).unwrap_err(),
            HpackError("header list over 64 KiB")
        );
        // A size update to 0 empties the table; a later index into it fails.
        let mut d = Decoder::default();
        d.decode(&hex("8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff"))
            .unwrap();
        assert!(d.decode(&hex("20 be")).is_err());
        assert_eq!(d.size, 0);
    }

    #[test]
    fn an_entry_larger_than_the_table_empties_it() {
        let mut d = Decoder::default();
        d.decode(&hex("8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff"))
            .unwrap();
        let mut block = vec![0x40];
        put_string(&mut block, "big");
        put_string(&mut block, &"v".repeat(5000));
        assert_eq!(d.decode(&block).unwrap().len(), 1);
        assert_eq!((d.size, d.table.len()), (0, 0));
    }
}

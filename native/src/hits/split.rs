//! Where an answer's values start and end: the elements of a JSON array, and the
//! `FeatureRow.values` records of a gRPC row.

use crate::codecs::read_varint;

/// Where each `FeatureRow.values` record of `wire` (tag 0x12, length, payload) starts and
/// ends, its tag included. None if `wire` is not such records alone.
pub(super) fn value_records(wire: &[u8], out: &mut Vec<(usize, usize)>) -> Option<()> {
    out.clear();
    let mut pos = 0;
    while pos < wire.len() {
        let start = pos;
        if wire[pos] != 0x12 {
            return None;
        }
        pos += 1;
        let len = usize::try_from(read_varint(wire, &mut pos).ok()?).ok()?;
        pos = pos.checked_add(len).filter(|&end| end <= wire.len())?;
        out.push((start, pos));
    }
    Some(())
}

/// What a byte is to `json_elements`: nothing (0), a comma (1), an opening (2) or closing
/// (3) bracket or brace, a quote (4).
static JSON_CLASSES: [u8; 256] = {
    let mut classes = [0u8; 256];
    classes[b',' as usize] = 1;
    classes[b'[' as usize] = 2;
    classes[b'{' as usize] = 2;
    classes[b']' as usize] = 3;
    classes[b'}' as usize] = 3;
    classes[b'"' as usize] = 4;
    classes
};

/// Where each element of the JSON array `json` starts and ends (commas and brackets
/// excluded), strings and nested arrays or objects kept whole. None if `json` is not an
/// array. One table lookup per byte outside strings: a hit of some features splits its
/// entry's JSON (about 1.2 KB of the standard shape) once per answer.
pub(super) fn json_elements(json: &[u8], out: &mut Vec<(usize, usize)>) -> Option<()> {
    out.clear();
    if json.len() < 2 || json[0] != b'[' || json[json.len() - 1] != b']' {
        return None;
    }
    let end = json.len() - 1;
    if end == 1 {
        return Some(()); // []
    }
    let inner = &json[..end];
    let (mut depth, mut start, mut i) = (0usize, 1, 1);
    while i < end {
        match JSON_CLASSES[usize::from(inner[i])] {
            0 => {
                while i + 1 < end && JSON_CLASSES[usize::from(inner[i + 1])] == 0 {
                    i += 1; // a number's digits, a literal's letters
                }
            }
            1 => {
                if depth == 0 {
                    out.push((start, i));
                    start = i + 1;
                }
            }
            2 => {
                // an array of numbers (an embedding, a list) whole, at memchr's pace: it ends
                // at the first bracket when neither a quote nor a bracket nor a brace is in it
                let rest = &inner[i + 1..];
                match memchr::memchr3(b'"', b'[', b']', rest) {
                    Some(k) if inner[i] == b'[' && rest[k] == b']' => {
                        if memchr::memchr2(b'{', b'}', &rest[..k]).is_some() {
                            depth += 1;
                        } else {
                            i += k + 1; // its closing bracket
                        }
                    }
                    _ => depth += 1,
                }
            }
            3 => depth = depth.checked_sub(1)?,
            _ => {
                // a string, to its closing quote (None: it does not close)
                i += 1;
                loop {
                    match *inner.get(i)? {
                        b'"' => break,
                        b'\\' => i += 2,
                        _ => i += 1,
                    }
                }
            }
        }
        i += 1;
    }
    if depth != 0 {
        return None;
    }
    out.push((start, end));
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_elements_are_split_at_the_top_level_commas() {
        let split = |json: &[u8]| {
            let mut at = Vec::new();
            json_elements(json, &mut at).map(|()| {
                at.iter()
                    .map(|&(s, e)| String::from_utf8(json[s..e].to_vec()).unwrap())
                    .collect::<Vec<_>>()
            })
        };
        assert_eq!(split(b"[]"), Some(vec![]));
        assert_eq!(split(b"[1.5]"), Some(vec!["1.5".to_owned()]));
        assert_eq!(
            split(br#"[null,[1,2,[3]],"a,\"]b",{"k":[1,2]},-4]"#),
            Some(
                ["null", "[1,2,[3]]", r#""a,\"]b""#, r#"{"k":[1,2]}"#, "-4"]
                    .map(str::to_owned)
                    .to_vec()
            )
        );
        assert_eq!(split(b"[1,2"), None);
        assert_eq!(split(b"[1,]]"), None);
        assert_eq!(split(br#"["a]"#), None);
        assert_eq!(
            split(br#"["a\\",1]"#),
            Some([r#""a\\""#, "1"].map(str::to_owned).to_vec())
        );
        assert_eq!(split(br#"["a\"]"#), None);
        assert_eq!(
            split(br#"[[1.5,-2e-7],[],["]",3],[[4]],[{"a":[5]}],[{]]"#),
            None // the last one does not close
        );
        assert_eq!(
            split(br#"[[1.5,-2e-7],[],["]",3],[[4]],[{"a":[5]}],7]"#),
            Some(
                [
                    "[1.5,-2e-7]",
                    "[]",
                    r#"["]",3]"#,
                    "[[4]]",
                    r#"[{"a":[5]}]"#,
                    "7"
                ]
                .map(str::to_owned)
                .to_vec()
            )
        );
        assert_eq!(split(br#"["a\]"#), None);
        assert_eq!(split(b"1,2"), None);
    }

    #[test]
    fn value_records_are_split_whole() {
        let split = |wire: &[u8]| {
            let mut at = Vec::new();
            value_records(wire, &mut at).map(|()| at)
        };
        assert_eq!(split(b""), Some(vec![]));
        assert_eq!(
            split(b"\x12\x00\x12\x02\x08\x01\x12\x01\x0A"),
            Some(vec![(0, 2), (2, 6), (6, 9)])
        );
        assert_eq!(split(b"\x12\x05\x08"), None); // past the end
        assert_eq!(split(b"\x1A\x00"), None); // another field
    }
}

//! How payloads, which are bytes, travel in the API's JSON: as `payload`
//! (text) when they are UTF-8, as `payloadBase64` (standard base64 with
//! padding, RFC 4648) otherwise. Exactly one of the two is set, both ways.

use serde_json::{json, Value};

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Sets `payload` or `payloadBase64` on `v`.
pub fn set(v: &mut Value, payload: &[u8]) {
    match std::str::from_utf8(payload) {
        Ok(text) => v["payload"] = json!(text),
        Err(_) => v["payloadBase64"] = json!(encode(payload)),
    }
}

/// The bytes of a message given as `payload` or `payloadBase64`, or what
/// is wrong with them, naming the field under `at` (`messages[3]`).
pub fn get(at: &str, text: Option<String>, base64: Option<&str>) -> Result<Vec<u8>, String> {
    match (text, base64) {
        (Some(text), None) => Ok(text.into_bytes()),
        (None, Some(b)) => decode(b).ok_or_else(|| {
            format!("{at}.payloadBase64 is not standard base64 (A-Z a-z 0-9 + /, padded with =)")
        }),
        (None, None) => Err(format!(
            "{at} has no payload: give payload (text) or payloadBase64"
        )),
        (Some(_), Some(_)) => Err(format!("{at} has both payload and payloadBase64: give one")),
    }
}

pub fn encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Padded standard base64 only: what [`encode`] writes and what the
/// usual encoders (`base64`, `btoa`, Python's `b64encode`) write.
pub fn decode(text: &str) -> Option<Vec<u8>> {
    let bytes = text.as_bytes();
    if !bytes.len().is_multiple_of(4) {
        return None;
    }
    let value = |c: u8| ALPHABET.iter().position(|&a| a == c).map(|v| v as u32);
    let mut out = Vec::with_capacity(bytes.len() / 4 * 3);
    let quads = bytes.len() / 4;
    for (q, quad) in bytes.chunks(4).enumerate() {
        let padding = quad.iter().rev().take_while(|&&c| c == b'=').count();
        if padding > 2 || (padding > 0 && q + 1 != quads) {
            return None;
        }
        let mut n = 0u32;
        for &c in &quad[..4 - padding] {
            n = (n << 6) | value(c)?;
        }
        n <<= 6 * padding as u32;
        let three = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&three[..3 - padding]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const VECTORS: [(&str, &str); 7] = [
        ("", ""),
        ("f", "Zg=="),
        ("fo", "Zm8="),
        ("foo", "Zm9v"),
        ("foob", "Zm9vYg=="),
        ("fooba", "Zm9vYmE="),
        ("foobar", "Zm9vYmFy"),
    ];

    #[test]
    fn base64_matches_the_rfc_vectors_both_ways() {
        for (input, output) in VECTORS {
            assert_eq!(encode(input.as_bytes()), output);
            assert_eq!(decode(output).as_deref(), Some(input.as_bytes()));
        }
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(decode(&encode(&all)), Some(all));
    }

    #[test]
    fn malformed_base64_is_refused() {
        for bad in ["Zg", "Zg=", "Z===", "Zg==Zg==", "Zm9v!A==", "Zm 9v"] {
            assert_eq!(decode(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn payloads_travel_as_text_when_utf8_and_as_base64_otherwise() {
        let mut text = json!({});
        set(&mut text, "héllo".as_bytes());
        assert_eq!(text, json!({ "payload": "héllo" }));
        let mut binary = json!({});
        set(&mut binary, &[0xff, 0x00]);
        assert_eq!(binary, json!({ "payloadBase64": "/wA=" }));
    }

    #[test]
    fn a_payload_is_given_exactly_once() {
        assert_eq!(get("m", Some("x".into()), None).unwrap(), b"x");
        assert_eq!(get("m", None, Some("/wA=")).unwrap(), [0xff, 0]);
        for (text, b64, says) in [
            (None, None, "m has no payload"),
            (Some("x".to_owned()), Some("eA=="), "m has both"),
            (None, Some("%%"), "m.payloadBase64 is not standard base64"),
        ] {
            let err = get("m", text, b64).unwrap_err();
            assert!(err.starts_with(says), "{err}");
        }
    }
}

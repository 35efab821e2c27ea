//! How payloads, which are bytes, travel in the API's JSON: as `payload`
//! (text) when they are UTF-8, as `payloadBase64` (standard base64 with
//! padding, RFC 4648) otherwise. Exactly one of the two is set, both ways.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use serde::ser::SerializeMap;

use crate::invalid::Invalid;

/// Writes `payload` or `payloadBase64` into a JSON object being written
/// (the object is never built as a map first: the event stream writes one
/// per message).
pub fn entry<M: SerializeMap>(map: &mut M, payload: &[u8]) -> Result<(), M::Error> {
    match std::str::from_utf8(payload) {
        Ok(text) => map.serialize_entry("payload", text),
        Err(_) => map.serialize_entry("payloadBase64", &encode(payload)),
    }
}

/// The bytes of a message given as `payload` or `payloadBase64`, or what
/// is wrong with them, naming the field under `at` (`messages[3]`).
pub(crate) fn get(
    at: &str,
    text: Option<String>,
    base64: Option<&str>,
) -> Result<Vec<u8>, Invalid> {
    match (text, base64) {
        (Some(text), None) => Ok(text.into_bytes()),
        (None, Some(b)) => decode(b).ok_or_else(|| {
            Invalid(format!(
                "{at}.payloadBase64 is not standard base64 (A-Z a-z 0-9 + /, padded with =)"
            ))
        }),
        (None, None) => Err(Invalid(format!(
            "{at} has no payload: give payload (text) or payloadBase64"
        ))),
        (Some(_), Some(_)) => Err(Invalid(format!(
            "{at} has both payload and payloadBase64: give one"
        ))),
    }
}

pub fn encode(bytes: &[u8]) -> String {
    STANDARD.encode(bytes)
}

/// Padded standard base64 only, as [`encode`] writes it and as the usual
/// encoders (`btoa`, Python's `b64encode`, `base64` on the command line)
/// do; line breaks (`base64` wraps at 76 columns) are skipped. Anything
/// else is refused, including padding bits that are not zero (`Zh==`), so
/// that one payload has one spelling (the `base64` crate's standard engine
/// refuses those and missing padding by itself).
pub fn decode(text: &str) -> Option<Vec<u8>> {
    if text.contains(['\n', '\r']) {
        let flat: String = text.chars().filter(|c| !matches!(c, '\n' | '\r')).collect();
        return STANDARD.decode(flat).ok();
    }
    STANDARD.decode(text).ok()
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
        for bad in [
            "Zg", "Zg=", "Z===", "Zg==Zg==", "Zm9v!A==", "Zm 9v", "Zh==", "Zm9=", "=Zg=",
        ] {
            assert_eq!(decode(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn line_breaks_of_wrapping_encoders_are_skipped() {
        // What `base64` prints for 60 bytes: 76 columns, then the rest.
        let bytes: Vec<u8> = (0..60).collect();
        let flat = encode(&bytes);
        let wrapped = format!("{}\n{}\n", &flat[..76], &flat[76..]);
        assert_eq!(decode(&wrapped), Some(bytes.clone()));
        assert_eq!(decode(&wrapped.replace('\n', "\r\n")), Some(bytes));
    }

    /// An object holding only the payload, as [`entry`] writes it.
    struct Only<'a>(&'a [u8]);

    impl serde::Serialize for Only<'_> {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            let mut map = s.serialize_map(Some(1))?;
            entry(&mut map, self.0)?;
            map.end()
        }
    }

    #[test]
    fn payloads_travel_as_text_when_utf8_and_as_base64_otherwise() {
        let text = serde_json::to_value(Only("héllo".as_bytes())).unwrap();
        assert_eq!(text, serde_json::json!({ "payload": "héllo" }));
        let binary = serde_json::to_value(Only(&[0xff, 0x00])).unwrap();
        assert_eq!(binary, serde_json::json!({ "payloadBase64": "/wA=" }));
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
            assert!(err.0.starts_with(says), "{err}");
        }
    }
}

//! How a connection to the database is made: the parsed URL and its TLS
//! ([`Endpoint`]), every connection of a store handle the same way.
//!
//! TLS as libpq users know it: tokio-postgres parses only
//! `sslmode=disable|prefer|require`, so the URL's `sslmode=verify-ca`,
//! `sslmode=verify-full` and `sslrootcert=FILE` are taken out of it here
//! and turned into how the server's certificate is checked (rustls, through
//! tokio-postgres-rustls):
//!
//! - with a CA (the CA file the process is given, or `sslrootcert`): the
//!   chain and the host name, or the chain only with `verify-ca` and
//!   `require` (as libpq); a CA makes TLS required (a URL without `sslmode`
//!   would otherwise fall back to plain text, and the CA would protect
//!   nothing);
//! - `verify-ca` or `verify-full` without a CA is refused (this process
//!   trusts no public roots: a database's CA is its operator's);
//! - `require` or `prefer` without a CA: encrypted, the certificate not
//!   checked, as libpq does.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{Client, Config, Connection, Socket};
use tokio_postgres_rustls::MakeRustlsConnect;

/// The URL's settings and the TLS they ask for.
#[derive(Clone)]
pub(super) struct Endpoint {
    pub config: Config,
    pub tls: MakeRustlsConnect,
}

type Stream = <MakeRustlsConnect as MakeTlsConnect<Socket>>::Stream;

impl Endpoint {
    pub async fn connect(
        &self,
    ) -> Result<(Client, Connection<Socket, Stream>), tokio_postgres::Error> {
        self.config.connect(self.tls.clone()).await
    }
}

/// How the server's certificate is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Check {
    /// Encrypted, not authenticated (`require` or `prefer` without a CA).
    Nothing,
    /// Signed by the CA (`verify-ca`).
    Chain,
    /// Signed by the CA, for the host connected to (`verify-full`, and no
    /// mode or `prefer` given with a CA).
    Full,
}

/// What the URL said about TLS, taken out of it.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct UrlTls {
    /// The URL without `sslrootcert`, and with `verify-*` as `require`.
    pub url: String,
    pub sslmode: Option<String>,
    pub sslrootcert: Option<String>,
}

/// Takes `sslmode` and `sslrootcert` out of `url` (a `postgres://` URL's
/// query, or libpq's `key=value` words).
pub(super) fn take_from(url: &str) -> UrlTls {
    let mut found = UrlTls::default();
    // What stays of a `key=value`: itself, `sslmode=require` for a
    // `verify-*` mode, or nothing for `sslrootcert`.
    let mut keep = |key: &str, value: &str, word: &str| -> Option<String> {
        match key {
            "sslrootcert" => {
                found.sslrootcert = Some(value.to_owned());
                None
            }
            "sslmode" => {
                found.sslmode = Some(value.to_owned());
                // Only the two modes libpq has: any other value is left for
                // the parser to refuse, never read as a mode that checks.
                Some(if matches!(value, "verify-ca" | "verify-full") {
                    "sslmode=require".to_owned()
                } else {
                    word.to_owned()
                })
            }
            _ => Some(word.to_owned()),
        }
    };
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let params: Vec<String> = query
            .split('&')
            .filter(|p| !p.is_empty())
            .filter_map(|p| {
                let (key, value) = p.split_once('=').unwrap_or((p, ""));
                let value = percent_encoding::percent_decode_str(value).decode_utf8_lossy();
                keep(key, &value, p)
            })
            .collect();
        found.url = if params.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", params.join("&"))
        };
    } else {
        // libpq's words, a quoted value (spaces, \' inside) kept whole.
        found.url = words(url)
            .into_iter()
            .filter_map(|word| match word.split_once('=') {
                Some((key, value)) => keep(key.trim(), &unquote(value.trim()), &word),
                None => Some(word),
            })
            .collect::<Vec<_>>()
            .join(" ");
    }
    found
}

/// libpq's `key=value` words: split at white space outside single quotes
/// (in which a backslash escapes the next character), each kept as written.
fn words(text: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let (mut quoted, mut escaped) = (false, false);
    for c in text.chars() {
        if escaped {
            escaped = false;
        } else if quoted && c == '\\' {
            escaped = true;
        } else if c == '\'' {
            quoted = !quoted;
        } else if c.is_whitespace() && !quoted {
            if !word.is_empty() {
                words.push(std::mem::take(&mut word));
            }
            continue;
        }
        word.push(c);
    }
    if !word.is_empty() {
        words.push(word);
    }
    words
}

/// A word's value without its quotes and escapes.
fn unquote(value: &str) -> String {
    let Some(inner) = value.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')) else {
        return value.to_owned();
    };
    let mut out = String::new();
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        out.push(if c == '\\' {
            chars.next().unwrap_or(c)
        } else {
            c
        });
    }
    out
}

/// Why TLS cannot be set up as asked.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("sslmode={0} checks the server's certificate, but no CA was given: give a CA file (--store-ca-file) or sslrootcert=FILE in the URL")]
    NoCa(String),
    #[error("a CA was given with sslmode=disable: TLS is off, so the CA would check nothing; use sslmode=verify-full (or leave sslmode out)")]
    CaWithoutTls,
    #[error("sslrootcert {path:?} cannot be read: {reason}")]
    RootCert { path: String, reason: String },
    #[error("the CA certificate is not PEM ({0}); expected one or more -----BEGIN CERTIFICATE----- blocks")]
    InvalidCa(String),
}

/// How to check the server (and whether TLS is required) from the URL's
/// `sslmode` and the CA, if any.
pub(super) fn check_for(sslmode: Option<&str>, ca: bool) -> Result<(Check, bool), TlsError> {
    match (sslmode, ca) {
        (Some("disable"), true) => Err(TlsError::CaWithoutTls),
        (Some(mode @ ("verify-ca" | "verify-full")), false) => Err(TlsError::NoCa(mode.to_owned())),
        // libpq checks the chain only for these two when given a CA.
        (Some("verify-ca" | "require"), true) => Ok((Check::Chain, true)),
        (_, true) => Ok((Check::Full, true)),
        (_, false) => Ok((Check::Nothing, false)),
    }
}

/// The connector for every connection of one store handle.
pub(super) fn connector(
    check: Check,
    ca_pem: Option<&[u8]>,
) -> Result<MakeRustlsConnect, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("ring supports the default TLS versions");
    let config = match (check, ca_pem) {
        (Check::Nothing, _) | (_, None) => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Lenient {
                chain: None,
                provider,
            }))
            .with_no_client_auth(),
        (check, Some(pem)) => {
            let mut roots = RootCertStore::empty();
            let mut found = 0;
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert = cert.map_err(|e| TlsError::InvalidCa(e.to_string()))?;
                roots
                    .add(cert)
                    .map_err(|e| TlsError::InvalidCa(e.to_string()))?;
                found += 1;
            }
            if found == 0 {
                return Err(TlsError::InvalidCa("no certificate in it".into()));
            }
            let webpki =
                WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                    .build()
                    .map_err(|e| TlsError::InvalidCa(e.to_string()))?;
            if check == Check::Chain {
                builder
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(Lenient {
                        chain: Some(webpki),
                        provider,
                    }))
                    .with_no_client_auth()
            } else {
                builder.with_webpki_verifier(webpki).with_no_client_auth()
            }
        }
    };
    Ok(MakeRustlsConnect::new(config))
}

/// Why the server's certificate was refused, if that is why `e` failed:
/// a refusal a retry will not cure (the CA or the host name is wrong).
pub(super) fn refused_certificate(e: &tokio_postgres::Error) -> Option<String> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(c) = cause {
        let tls = c.downcast_ref::<rustls::Error>().or_else(|| {
            c.downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        });
        if let Some(rustls::Error::InvalidCertificate(why)) = tls {
            return Some(format!("its certificate was refused: {why}"));
        }
        cause = c.source();
    }
    None
}

/// A check short of webpki's full one: with no chain, `require` without a
/// CA (any certificate); with one, `verify-ca` (the chain to the CA,
/// whatever host name the certificate was made for). Either way the
/// handshake's own signatures are still checked (the session is encrypted
/// to whoever holds the certificate's key).
#[derive(Debug)]
struct Lenient {
    chain: Option<Arc<WebPkiServerVerifier>>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Lenient {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName))
            | Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verify_modes_and_the_root_cert_leave_the_url() {
        let t = take_from(
            "postgres://u@h:5432/db?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem&connect_timeout=3",
        );
        assert_eq!(
            t.url,
            "postgres://u@h:5432/db?sslmode=require&connect_timeout=3"
        );
        assert_eq!(t.sslmode.as_deref(), Some("verify-full"));
        assert_eq!(t.sslrootcert.as_deref(), Some("/etc/ca.pem"));

        let t = take_from("postgres://u@h/db");
        assert_eq!(
            t,
            UrlTls {
                url: "postgres://u@h/db".into(),
                ..UrlTls::default()
            }
        );

        // A quoted value keeps its spaces and escapes, and is not read as
        // a setting of its own.
        let t =
            take_from("host=h password='a  b sslmode=verify-full \\' c' sslrootcert='/my ca.pem'");
        assert_eq!(t.url, "host=h password='a  b sslmode=verify-full \\' c'");
        assert_eq!(t.sslmode, None);
        assert_eq!(t.sslrootcert.as_deref(), Some("/my ca.pem"));

        // A mode libpq does not have is left for the parser to refuse.
        let t = take_from("postgres://u@h/db?sslmode=verify-fulll");
        assert_eq!(t.url, "postgres://u@h/db?sslmode=verify-fulll");
        assert!(t.url.parse::<tokio_postgres::Config>().is_err());

        let t = take_from("host=h dbname=db sslmode=verify-ca sslrootcert=/ca.pem");
        assert_eq!(t.url, "host=h dbname=db sslmode=require");
        assert_eq!(t.sslmode.as_deref(), Some("verify-ca"));
        assert_eq!(t.sslrootcert.as_deref(), Some("/ca.pem"));
    }

    #[test]
    fn a_ca_means_a_checked_tls_and_a_check_needs_a_ca() {
        assert_eq!(check_for(None, true).unwrap(), (Check::Full, true));
        assert_eq!(
            check_for(Some("prefer"), true).unwrap(),
            (Check::Full, true)
        );
        assert_eq!(
            check_for(Some("verify-ca"), true).unwrap(),
            (Check::Chain, true)
        );
        assert_eq!(
            check_for(Some("require"), true).unwrap(),
            (Check::Chain, true)
        );
        assert_eq!(
            check_for(Some("verify-full"), true).unwrap(),
            (Check::Full, true)
        );
        assert_eq!(
            check_for(Some("require"), false).unwrap(),
            (Check::Nothing, false)
        );
        assert_eq!(check_for(None, false).unwrap(), (Check::Nothing, false));
        let no_ca = check_for(Some("verify-full"), false)
            .unwrap_err()
            .to_string();
        assert!(
            no_ca.contains("sslrootcert") && no_ca.contains("--store-ca-file"),
            "{no_ca}"
        );
        assert!(matches!(
            check_for(Some("disable"), true),
            Err(TlsError::CaWithoutTls)
        ));
    }

    #[test]
    fn a_ca_that_is_not_pem_is_named() {
        let Err(e) = connector(Check::Full, Some(b"not a certificate")) else {
            panic!("a CA that is not PEM was taken");
        };
        assert!(e.to_string().contains("not PEM"), "{e}");
    }
}

//! How to reach a store beyond its URL.

/// How to reach the store beyond its URL. All optional.
#[derive(Debug, Clone, Copy, Default)]
pub struct ConnectOptions<'a> {
    /// The password of the server (wins over one in the URL).
    pub password: Option<&'a str>,
    /// PEM of the CA that signed the server's (and the sentinels')
    /// certificate, for a `rediss` URL.
    pub ca_pem: Option<&'a [u8]>,
    /// The sentinels' own password, for a Sentinel URL whose sentinels
    /// require one.
    pub sentinel_password: Option<&'a str>,
}

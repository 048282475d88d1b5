//! TLS as libpq does it, with rustls: the DSN's `sslmode` decides whether
//! TLS is used and how far the server's certificate is checked.
//!
//! | `sslmode` | TLS | certificate check without [`ClientBuilder::tls`](crate::ClientBuilder::tls) |
//! | --- | --- | --- |
//! | `disable` | never | — |
//! | `prefer` (the default) | when the server offers it | none (as libpq) |
//! | `require` | always | none (as libpq) |
//! | `verify-ca` | always | chain to the webpki roots; any host name |
//! | `verify-full` | always | chain to the webpki roots and the host name |
//!
//! A configuration given with `ClientBuilder::tls` is used as it is in every
//! mode but `disable` (rustls then checks chain and host name, as
//! `verify-full` does). `prefer` and `require` encrypt but, like libpq, do not
//! authenticate the server; SCRAM channel binding (used by default when the
//! server offers it) still keeps a man in the middle from logging in with the
//! password. Use `verify-full` (with `ClientBuilder::tls` for a private CA)
//! where the server must be authenticated.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};

use crate::error::Error;

/// How a connection uses TLS, from the DSN's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TlsMode {
    /// `disable`, `allow`, `prefer` or `require`: no certificate check.
    Unverified,
    /// `verify-ca`: chain only.
    VerifyCa,
    /// `verify-full`: chain and host name.
    VerifyFull,
}

/// Reads `sslmode` (and refuses `sslrootcert`, which would need a file read)
/// and returns the DSN tokio-postgres can parse: `verify-ca` and
/// `verify-full` become `require` there, the check is done by the rustls
/// configuration.
pub(crate) fn split_dsn(dsn: &str) -> Result<(String, TlsMode), Error> {
    let mut mode = TlsMode::Unverified;
    let mut refused = None;
    let out = crate::dsn::map_params(dsn, false, |key, value| match (key, value) {
        ("sslmode", "verify-ca") => {
            mode = TlsMode::VerifyCa;
            Some(Some("require".to_owned()))
        }
        ("sslmode", "verify-full") => {
            mode = TlsMode::VerifyFull;
            Some(Some("require".to_owned()))
        }
        // tokio-postgres has no `allow` (plain first, then TLS); `prefer` is nearest.
        ("sslmode", "allow") => Some(Some("prefer".to_owned())),
        ("sslrootcert" | "sslcert" | "sslkey", _) => {
            refused = Some(key.to_owned());
            None
        }
        _ => None,
    });
    if let Some(key) = refused {
        return Err(Error::Config(format!(
            "`{key}` in the DSN is not read: load the certificates into a rustls::ClientConfig \
             and pass it with ClientBuilder::tls"
        )));
    }
    Ok((out, mode))
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn webpki_roots() -> rustls::RootCertStore {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    roots
}

/// The rustls configuration for `mode` when the caller gave none.
pub(crate) fn default_config(mode: TlsMode) -> rustls::ClientConfig {
    let provider = provider();
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions");
    let roots = webpki_roots();
    if mode == TlsMode::VerifyFull {
        return builder.with_root_certificates(roots).with_no_client_auth();
    }
    let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .expect("the webpki roots are usable");
    builder
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(Lenient {
            webpki,
            check_chain: mode == TlsMode::VerifyCa,
        }))
        .with_no_client_auth()
}

/// The checks of `verify-ca` (chain only, any host name) and of `prefer` and
/// `require` (none, as libpq). Handshake signatures are always checked, so
/// the session belongs to whoever holds the presented certificate's key.
#[derive(Debug)]
struct Lenient {
    webpki: Arc<WebPkiServerVerifier>,
    check_chain: bool,
}

impl ServerCertVerifier for Lenient {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if !self.check_chain {
            return Ok(ServerCertVerified::assertion());
        }
        match self
            .webpki
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
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
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sslmodes() {
        let (dsn, mode) = split_dsn("postgres://u:p@h/db?sslmode=verify-full").unwrap();
        assert_eq!(dsn, "postgres://u:p@h/db?sslmode=require");
        assert_eq!(mode, TlsMode::VerifyFull);
        let (dsn, mode) = split_dsn("host=h sslmode=verify-ca user=u").unwrap();
        assert_eq!(dsn, "host=h sslmode=require user=u");
        assert_eq!(mode, TlsMode::VerifyCa);
        for plain in [
            "postgres://h/db",
            "postgres://h/db?sslmode=require",
            "host=h sslmode=disable",
        ] {
            assert_eq!(
                split_dsn(plain).unwrap(),
                (plain.to_owned(), TlsMode::Unverified)
            );
        }
        let (dsn, _) = split_dsn("postgres://h/db?sslmode=allow").unwrap();
        assert_eq!(dsn, "postgres://h/db?sslmode=prefer");
        let err = split_dsn("postgres://u:secret@h/db?sslrootcert=/x/ca.pem").unwrap_err();
        assert!(err.to_string().contains("ClientBuilder::tls"), "{err}");
        assert!(!err.to_string().contains("secret"));
        // Every mode builds a configuration.
        for mode in [TlsMode::Unverified, TlsMode::VerifyCa, TlsMode::VerifyFull] {
            let _ = default_config(mode);
        }
    }
}

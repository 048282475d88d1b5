//! TLS as libpq does it, with rustls: the DSN's `sslmode` decides whether
//! TLS is used, and `sslrootcert` which root certificates the server's
//! certificate is checked against.
//!
//! | `sslmode` | TLS | server certificate check (no [`ClientBuilder::tls`](crate::ClientBuilder::tls)) | protects against |
//! | --- | --- | --- | --- |
//! | `disable` | never | — | nothing |
//! | `allow` | when the server offers it (tried first; see below) | chain, when a root certificate is configured; else none | a passive eavesdropper, when TLS is used |
//! | `prefer` (the default) | when the server offers it | chain, when a root certificate is configured; else none | a passive eavesdropper, when TLS is used; **not** an active attacker, who can refuse TLS |
//! | `require` | always | chain, when a root certificate is configured (as libpq); else none | a passive eavesdropper; an active attacker only with a root certificate |
//! | `verify-ca` | always | chain to the configured root; any host name | an attacker without a certificate from that root |
//! | `verify-full` | always | chain to the configured root and the host name | an attacker without a certificate for this host from that root |
//!
//! The root certificates, as libpq looks for them:
//!
//! - `sslrootcert=<file>`: the PEM certificates in that file. A file that
//!   cannot be read, or holds no certificate, fails the connection in every
//!   mode but `disable` (libpq silently skips a missing file in `require`).
//! - `sslrootcert=system`: the operating system's store (rustls-native-certs:
//!   `SSL_CERT_FILE`/`SSL_CERT_DIR`, else the platform's store). As in libpq
//!   16 this makes `verify-full` the default and refuses any weaker `sslmode`:
//!   a public root vouches for a name, so checking the chain alone would
//!   accept any public certificate for any host.
//! - neither: `~/.postgresql/root.crt` when that file exists (libpq's default;
//!   `PGSSLROOTCERT` is not read, as no `PG*` variable is).
//!
//! `verify-ca` and `verify-full` without any root certificate are refused
//! before connecting: a verifying mode never falls back to a built-in list
//! of public roots.
//!
//! With [`ClientBuilder::tls`](crate::ClientBuilder::tls) (or `pgmq
//! --ca-file`), TLS is required: `allow`, `prefer` or no `sslmode` become
//! `require`, and `disable` is refused as a contradiction.
//!
//! Differences from libpq, all on the stricter side: `allow` tries TLS first
//! (tokio-postgres cannot try plain first), and `allow`/`prefer` do not retry
//! without TLS once a TLS handshake failed. `sslcert`/`sslkey` (client
//! certificates) are not read from the DSN: pass a configuration with
//! [`ClientBuilder::tls`](crate::ClientBuilder::tls).
//!
//! `channel_binding` is passed to tokio-postgres as it is: `prefer` (the
//! default) uses SCRAM channel binding when the server offers
//! `SCRAM-SHA-256-PLUS`; `require` refuses to authenticate in any other way.
//! Only `require` keeps the password from an active attacker in the
//! unverified modes: with `prefer` a man in the middle can ask for the
//! password in clear text, and the client sends it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};

use crate::conn::dsn::{ConnInfo, DsnError};
use crate::conn::error::Error;

/// The DSN's `sslmode`, as libpq reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SslMode {
    Disable,
    Allow,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn parse(value: &str) -> Option<SslMode> {
        Some(match value {
            "disable" => SslMode::Disable,
            "allow" => SslMode::Allow,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Allow => "allow",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

/// Where the root certificates come from (`sslrootcert`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RootCert {
    /// Not given: `~/.postgresql/root.crt` when it exists.
    Default,
    /// A PEM file.
    File(PathBuf),
    /// `sslrootcert=system`: the operating system's store.
    System,
}

/// The TLS settings read from a DSN.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TlsSettings {
    pub(crate) mode: SslMode,
    pub(crate) root: RootCert,
}

impl TlsSettings {
    /// The mode tokio-postgres negotiates with: it knows `disable`, `prefer`
    /// and `require`; the checks of `verify-*` are in the rustls configuration.
    pub(crate) fn wire_mode(&self) -> tokio_postgres::config::SslMode {
        use tokio_postgres::config::SslMode as Wire;
        match self.mode {
            SslMode::Disable => Wire::Disable,
            SslMode::Allow | SslMode::Prefer => Wire::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => Wire::Require,
        }
    }

    /// The rustls configuration for these settings when the caller gave none.
    pub(crate) fn client_config(&self) -> Result<rustls::ClientConfig, Error> {
        if self.mode == SslMode::Disable {
            return config_with(Checks::None);
        }
        let roots = match &self.root {
            RootCert::File(path) => Some(roots_from_file(path)?),
            RootCert::System => Some(system_roots()?),
            RootCert::Default => match default_root_file() {
                Some(path) => Some(roots_from_file(&path)?),
                None => None,
            },
        };
        let checks = match (self.mode, roots) {
            (SslMode::VerifyFull, Some(roots)) => Checks::Full(roots),
            (_, Some(roots)) => Checks::Chain(roots),
            (SslMode::VerifyCa | SslMode::VerifyFull, None) => {
                return Err(Error::Config(format!(
                    "sslmode={} needs a root certificate: set sslrootcert=<PEM file> (or \
                     sslrootcert=system for the system's store, with verify-full), put it in \
                     ~/.postgresql/root.crt, or pass a rustls configuration with \
                     ClientBuilder::tls",
                    self.mode.name()
                )))
            }
            (_, None) => Checks::None,
        };
        config_with(checks)
    }
}

impl TlsSettings {
    /// Reads `sslmode` and `sslrootcert` of a parsed DSN, refusing `sslcert`
    /// and `sslkey` (client certificates go through
    /// [`ClientBuilder::tls`](crate::ClientBuilder::tls)). With
    /// `caller_tls` (a configuration given to `ClientBuilder::tls`), a mode
    /// that would let a server go without TLS (`allow`, `prefer`, none
    /// given) becomes `require`: whoever configured how to check the server
    /// means it to be checked, and a proxy refusing TLS must not get the
    /// password; `disable` then contradicts the configuration and is refused.
    pub(crate) fn from_conninfo(info: &ConnInfo, caller_tls: bool) -> Result<TlsSettings, Error> {
        for keyword in ["sslcert", "sslkey"] {
            if info.get(keyword).is_some_and(|v| !v.is_empty()) {
                return Err(Error::Dsn(DsnError::Unsupported {
                    keyword,
                    reason: "client certificates are not read from the DSN: load them into a \
                             rustls::ClientConfig and pass it with ClientBuilder::tls",
                }));
            }
        }
        let mode = match info.get("sslmode") {
            None => None,
            Some(v) => Some(SslMode::parse(v).ok_or_else(|| {
                Error::Dsn(DsnError::InvalidValue {
                    keyword: "sslmode",
                    reason: "must be one of disable, allow, prefer, require, verify-ca, \
                             verify-full"
                        .to_owned(),
                })
            })?),
        };
        let root = match info.get("sslrootcert") {
            None | Some("") => RootCert::Default,
            Some("system") => RootCert::System,
            Some(path) => RootCert::File(PathBuf::from(path)),
        };
        let mode = match (mode, &root) {
            (None, RootCert::System) => SslMode::VerifyFull,
            (Some(m), RootCert::System) if m != SslMode::VerifyFull => {
                return Err(Error::Config(format!(
                    "weak sslmode={} may not be used with sslrootcert=system (use verify-full)",
                    m.name()
                )))
            }
            (Some(SslMode::Disable), _) if caller_tls => {
                return Err(Error::Config(
                    "sslmode=disable contradicts the TLS configuration given to \
                     ClientBuilder::tls (or --ca-file): leave one of them out"
                        .to_owned(),
                ))
            }
            (None | Some(SslMode::Allow | SslMode::Prefer), _) if caller_tls => SslMode::Require,
            (None, _) => SslMode::Prefer,
            (Some(m), _) => m,
        };
        Ok(TlsSettings { mode, root })
    }
}

/// libpq's default root certificate file, when it exists.
fn default_root_file() -> Option<PathBuf> {
    let home = std::env::var_os("HOME")?;
    let path = Path::new(&home).join(".postgresql").join("root.crt");
    path.is_file().then_some(path)
}

fn roots_from_file(path: &Path) -> Result<RootCertStore, Error> {
    use rustls::pki_types::pem::PemObject;
    let shown = path.display();
    let pem = std::fs::read(path)
        .map_err(|e| Error::Config(format!("sslrootcert {shown} could not be read: {e}")))?;
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| Error::Config(format!("sslrootcert {shown}: {e}")))?;
        roots
            .add(cert)
            .map_err(|e| Error::Config(format!("sslrootcert {shown}: {e}")))?;
    }
    if roots.is_empty() {
        return Err(Error::Config(format!(
            "sslrootcert {shown} holds no PEM certificate"
        )));
    }
    Ok(roots)
}

fn system_roots() -> Result<RootCertStore, Error> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    let (_added, _ignored) = roots.add_parsable_certificates(found.certs);
    if roots.is_empty() {
        let why = found
            .errors
            .first()
            .map(|e| format!(": {e}"))
            .unwrap_or_default();
        return Err(Error::Config(format!(
            "sslrootcert=system: no certificate found in the system's store{why}"
        )));
    }
    Ok(roots)
}

/// The crypto provider: *ring* with the default feature `ring`; without it,
/// the one the application installed for the process
/// (`CryptoProvider::install_default`).
fn provider() -> Result<Arc<CryptoProvider>, Error> {
    #[cfg(feature = "ring")]
    return Ok(Arc::new(rustls::crypto::ring::default_provider()));
    #[cfg(not(feature = "ring"))]
    CryptoProvider::get_default().cloned().ok_or_else(|| {
        Error::Config(
            "no rustls crypto provider: enable pgmq-client's feature `ring` (the default) or \
             install one with rustls::crypto::CryptoProvider::install_default before connecting"
                .into(),
        )
    })
}

/// What the server's certificate is checked for.
enum Checks {
    /// Nothing (handshake signatures only): `allow`, `prefer`, `require`
    /// without a root certificate.
    None,
    /// The chain to these roots, any host name.
    Chain(RootCertStore),
    /// The chain to these roots and the host name.
    Full(RootCertStore),
}

fn config_with(checks: Checks) -> Result<rustls::ClientConfig, Error> {
    let provider = provider()?;
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Config(format!("the rustls crypto provider: {e}")))?;
    let chain = match checks {
        Checks::Full(roots) => {
            return Ok(builder.with_root_certificates(roots).with_no_client_auth())
        }
        Checks::Chain(roots) => Some(
            WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                .build()
                .expect("a non-empty root store builds a verifier"),
        ),
        Checks::None => None,
    };
    Ok(builder
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(Lenient { chain, provider }))
        .with_no_client_auth())
}

/// The checks of `verify-ca` and of the unverified modes given a root
/// certificate (chain only, any host name), and of the unverified modes
/// without one (none, as libpq). Handshake signatures are always checked, so
/// the session belongs to whoever holds the presented certificate's key
/// (which is what channel binding relies on).
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
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        // webpki checks the chain before the name: a name error means the
        // chain was good.
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
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

    fn split(dsn: &str, caller_tls: bool) -> Result<TlsSettings, Error> {
        TlsSettings::from_conninfo(&ConnInfo::parse(dsn).unwrap(), caller_tls)
    }

    fn settings(dsn: &str) -> TlsSettings {
        split(dsn, false).unwrap()
    }

    #[test]
    fn every_libpq_sslmode_is_read() {
        for (name, mode) in [
            ("disable", SslMode::Disable),
            ("allow", SslMode::Allow),
            ("prefer", SslMode::Prefer),
            ("require", SslMode::Require),
            ("verify-ca", SslMode::VerifyCa),
            ("verify-full", SslMode::VerifyFull),
        ] {
            let s = settings(&format!("postgres://u:p@h/db?sslmode={name}"));
            assert_eq!(s.mode, mode);
            assert_eq!(s.root, RootCert::Default);
            let s = settings(&format!("host=h sslmode={name} user=u"));
            assert_eq!(s.mode, mode);
        }
        assert_eq!(settings("postgres://h/db").mode, SslMode::Prefer);
        assert_eq!(settings("host=h").mode, SslMode::Prefer);
        assert_eq!(settings("postgres://h/db?ssl=true").mode, SslMode::Require);
        let err = split("postgres://h/db?sslmode=verify_full", false).unwrap_err();
        assert!(err.to_string().contains("verify-full"), "{err}");
    }

    #[test]
    fn a_callers_tls_configuration_means_tls() {
        for dsn in [
            "postgres://h/db",
            "postgres://h/db?sslmode=allow",
            "host=h sslmode=prefer",
        ] {
            assert_eq!(split(dsn, true).unwrap().mode, SslMode::Require, "{dsn}");
        }
        let s = split("postgres://h/db?sslmode=verify-full", true).unwrap();
        assert_eq!(s.mode, SslMode::VerifyFull);
        let err = split("postgres://h/db?sslmode=disable", true).unwrap_err();
        assert!(err.to_string().contains("ClientBuilder::tls"), "{err}");
    }

    #[test]
    fn sslrootcert_file_and_system() {
        let s = settings("postgres://h/db?sslmode=verify-ca&sslrootcert=%2Fetc%2Fca%20x.pem");
        assert_eq!(s.root, RootCert::File("/etc/ca x.pem".into()));
        let s = settings("host=h sslrootcert='/etc/it\\'s.pem' sslmode=require");
        assert_eq!(s.root, RootCert::File("/etc/it's.pem".into()));
        assert_eq!(s.mode, SslMode::Require);
        // system: verify-full by default, weaker modes refused (libpq 16).
        let s = settings("postgres://h/db?sslrootcert=system");
        assert_eq!((s.mode, s.root), (SslMode::VerifyFull, RootCert::System));
        for weak in ["disable", "allow", "prefer", "require", "verify-ca"] {
            let err = split(
                &format!("postgres://h/db?sslrootcert=system&sslmode={weak}"),
                false,
            )
            .unwrap_err();
            assert!(err.to_string().contains("verify-full"), "{weak}: {err}");
        }
    }

    #[test]
    fn client_certificates_are_refused_without_the_password() {
        let err = split("postgres://u:secret@h/db?sslcert=/x/c.pem", false).unwrap_err();
        assert!(err.to_string().contains("ClientBuilder::tls"), "{err}");
        assert!(!err.to_string().contains("secret"));
    }

    #[test]
    fn verifying_modes_never_fall_back_to_public_roots() {
        // HOME without ~/.postgresql/root.crt in a test process is not
        // guaranteed; give a file that does not exist instead of relying on it.
        for mode in [SslMode::VerifyCa, SslMode::VerifyFull] {
            let err = TlsSettings {
                mode,
                root: RootCert::File("/nonexistent/pgmq-test/root.crt".into()),
            }
            .client_config()
            .unwrap_err();
            assert!(err.to_string().contains("could not be read"), "{err}");
        }
        if default_root_file().is_none() {
            for mode in [SslMode::VerifyCa, SslMode::VerifyFull] {
                let err = TlsSettings {
                    mode,
                    root: RootCert::Default,
                }
                .client_config()
                .unwrap_err();
                assert!(
                    err.to_string().contains("needs a root certificate"),
                    "{err}"
                );
            }
            for mode in [SslMode::Allow, SslMode::Prefer, SslMode::Require] {
                TlsSettings {
                    mode,
                    root: RootCert::Default,
                }
                .client_config()
                .unwrap();
            }
        }
        // An explicit file that cannot be read fails require too.
        let err = TlsSettings {
            mode: SslMode::Require,
            root: RootCert::File("/nonexistent/pgmq-test/root.crt".into()),
        }
        .client_config()
        .unwrap_err();
        assert!(err.to_string().contains("could not be read"), "{err}");
    }

    #[test]
    fn wire_modes() {
        use tokio_postgres::config::SslMode as Wire;
        let wire = |mode| {
            TlsSettings {
                mode,
                root: RootCert::Default,
            }
            .wire_mode()
        };
        assert_eq!(wire(SslMode::Disable), Wire::Disable);
        assert_eq!(wire(SslMode::Allow), Wire::Prefer);
        assert_eq!(wire(SslMode::Prefer), Wire::Prefer);
        for m in [SslMode::Require, SslMode::VerifyCa, SslMode::VerifyFull] {
            assert_eq!(wire(m), Wire::Require);
        }
    }
}

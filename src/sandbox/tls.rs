//! The sandbox's TLS certificates: a fresh self-signed CA per cluster and a server certificate
//! it signs, for [`PgClusterOptions::ssl`](super::postgres::PgClusterOptions::ssl), and for the
//! tests of TLS client settings (a CA file librdkafka accepts).
//!
//! Invariants: P-256 keys, SHA-256 signatures, ten years' validity from now and a random serial
//! (127 bits). The CA certificate is marked critical `CA:TRUE` (`keyCertSign`, `cRLSign`);
//! the server certificate is `CA:FALSE`, for TLS server authentication only, valid for
//! `localhost` and `127.0.0.1`, and names its CA's key. A leaf: OpenSSL only, nothing else of
//! walbox, so errors stay OpenSSL's [`ErrorStack`] (the caller turns them into `SandboxError::Tls`).

use openssl::asn1::Asn1Time;
use openssl::bn::{BigNum, MsbOption};
use openssl::ec::{EcGroup, EcKey};
use openssl::error::ErrorStack;
use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::pkey::{PKey, Private};
use openssl::x509::extension::{
    AuthorityKeyIdentifier, BasicConstraints, ExtendedKeyUsage, KeyUsage, SubjectAlternativeName,
    SubjectKeyIdentifier,
};
use openssl::x509::{X509Name, X509};

/// Issues a ten-year P-256 certificate for `cn` and its key: a CA
/// certificate when `issuer` is `None` (self-signed), else a server
/// certificate for `localhost` and `127.0.0.1` signed by `issuer`.
pub fn issue_cert(
    cn: &str,
    issuer: Option<(&X509, &PKey<Private>)>,
) -> Result<(X509, PKey<Private>), ErrorStack> {
    let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1)?;
    let key = PKey::from_ec_key(EcKey::generate(&group)?)?;
    let mut name = X509Name::builder()?;
    name.append_entry_by_nid(Nid::COMMONNAME, cn)?;
    let name = name.build();
    let mut serial = BigNum::new()?;
    serial.rand(127, MsbOption::MAYBE_ZERO, false)?;
    let mut cert = X509::builder()?;
    cert.set_version(2)?;
    cert.set_serial_number(serial.to_asn1_integer()?.as_ref())?;
    cert.set_subject_name(&name)?;
    cert.set_issuer_name(issuer.map_or(&*name, |(ca, _)| ca.subject_name()))?;
    cert.set_pubkey(&key)?;
    cert.set_not_before(Asn1Time::days_from_now(0)?.as_ref())?;
    cert.set_not_after(Asn1Time::days_from_now(3650)?.as_ref())?;
    let extensions = match issuer {
        None => vec![
            BasicConstraints::new().critical().ca().build()?,
            KeyUsage::new()
                .critical()
                .key_cert_sign()
                .crl_sign()
                .build()?,
            SubjectKeyIdentifier::new().build(&cert.x509v3_context(None, None))?,
        ],
        Some((ca, _)) => vec![
            BasicConstraints::new().build()?,
            KeyUsage::new()
                .critical()
                .digital_signature()
                .key_encipherment()
                .build()?,
            ExtendedKeyUsage::new().server_auth().build()?,
            SubjectAlternativeName::new()
                .dns("localhost")
                .ip("127.0.0.1")
                .build(&cert.x509v3_context(Some(ca), None))?,
            AuthorityKeyIdentifier::new()
                .keyid(true)
                .build(&cert.x509v3_context(Some(ca), None))?,
        ],
    };
    for extension in extensions {
        cert.append_extension(extension)?;
    }
    cert.sign(
        issuer.map_or(&key, |(_, ca_key)| ca_key),
        MessageDigest::sha256(),
    )?;
    Ok((cert.build(), key))
}

//! A throwaway PKI for a test control plane: a CA, one serving certificate for every component
//! on 127.0.0.1, client certificates, and the service-account signing key.

use anyhow::{Context, Result};
use base64::Engine;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use std::path::{Path, PathBuf};

/// The certificate authority of one cluster, and the files it wrote.
pub struct Pki {
    issuer: Issuer<'static, KeyPair>,
    /// The CA certificate, PEM.
    pub ca_pem: String,
    /// Where the files live.
    pub dir: PathBuf,
}

impl std::fmt::Debug for Pki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pki")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

/// A client identity: a certificate and its key, PEM.
#[derive(Debug, Clone)]
pub struct ClientIdentity {
    /// Certificate, PEM.
    pub cert_pem: String,
    /// Private key, PEM.
    pub key_pem: String,
}

impl Pki {
    /// Creates a CA and the cluster's serving certificate and service-account key under `dir`.
    pub fn create(dir: &Path) -> Result<Pki> {
        std::fs::create_dir_all(dir)?;
        let mut params = CertificateParams::new(Vec::new())?;
        params
            .distinguished_name
            .push(DnType::CommonName, "runtimekit-e2e-ca");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate()?;
        let ca_pem = params.self_signed(&key)?.pem();
        write(dir, "ca.crt", &ca_pem)?;
        write(dir, "ca.key", &key.serialize_pem())?;
        let pki = Pki {
            issuer: Issuer::new(params, key),
            ca_pem,
            dir: dir.to_owned(),
        };

        // One serving certificate for every component: they all listen on 127.0.0.1.
        let mut params = CertificateParams::new(vec!["127.0.0.1".into(), "localhost".into()])?;
        params
            .distinguished_name
            .push(DnType::CommonName, "127.0.0.1");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate()?;
        write(
            dir,
            "serving.crt",
            &params.signed_by(&key, &pki.issuer)?.pem(),
        )?;
        write(dir, "serving.key", &key.serialize_pem())?;

        // The apiserver reads verification keys only from public-key PEM, so write both halves.
        let service_account = KeyPair::generate()?;
        write(dir, "service-account.key", &service_account.serialize_pem())?;
        write(
            dir,
            "service-account.pub",
            &service_account.public_key_pem(),
        )?;
        Ok(pki)
    }

    /// A path to one of the files this PKI wrote (`ca.crt`, `serving.crt`, ...).
    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Issues a client certificate for `user` in `groups` (the apiserver reads the user from the
    /// CN and the groups from O).
    pub fn client(&self, user: &str, groups: &[&str]) -> Result<ClientIdentity> {
        let mut params = CertificateParams::new(Vec::new())?;
        params.distinguished_name.push(DnType::CommonName, user);
        for group in groups {
            params
                .distinguished_name
                .push(DnType::OrganizationName, *group);
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate()?;
        Ok(ClientIdentity {
            cert_pem: params.signed_by(&key, &self.issuer)?.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// A kubeconfig for `server` that authenticates as `identity`, with everything embedded.
    pub fn kubeconfig(&self, server: &str, user: &str, identity: &ClientIdentity) -> String {
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: runtimekit-e2e\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\nusers:\n- name: {user}\n  user:\n    client-certificate-data: {cert}\n    client-key-data: {key}\ncontexts:\n- name: runtimekit-e2e\n  context:\n    cluster: runtimekit-e2e\n    user: {user}\ncurrent-context: runtimekit-e2e\n",
            ca = b64(&self.ca_pem),
            cert = b64(&identity.cert_pem),
            key = b64(&identity.key_pem),
        )
    }
}

fn write(dir: &Path, name: &str, contents: &str) -> Result<()> {
    std::fs::write(dir.join(name), contents).with_context(|| format!("writing {name}"))
}

package proxy

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/elazarl/goproxy"
)

// ErrBundledCA is returned for goproxy's bundled CA, whose private key is
// published with goproxy's source: anyone could impersonate any site to a
// client that trusts it.
var ErrBundledCA = errors.New("proxy: refusing goproxy's bundled CA: its private key is public; remove ca_cert/ca_key to have solveonce create its own")

// Leaf certificate lifetimes.
const (
	caValidity      = 10 * 365 * 24 * time.Hour
	leafValidity    = 30 * 24 * time.Hour
	leafRenewBefore = 24 * time.Hour // a cached leaf this close to expiry is replaced
	maxLeaves       = 1024           // cached leaves; intercepted hosts are few
)

// CA is the certificate authority that signs MITM leaf certificates.
type CA struct {
	// Cert is the CA certificate; CertPEM its PEM encoding, as users
	// install it.
	Cert    *x509.Certificate
	CertPEM []byte
	key     crypto.Signer
}

// LoadOrCreateCA loads the CA in certFile and keyFile (PEM). When neither
// file exists it creates an ECDSA P-256 CA there (directories mode 0700,
// key mode 0600) and logs where. It refuses goproxy's bundled CA
// (ErrBundledCA), a certificate that is not a CA, and a key that does not
// match the certificate, and never overwrites one file when only the other
// exists.
func LoadOrCreateCA(certFile, keyFile string, log *slog.Logger) (*CA, error) {
	if log == nil {
		log = slog.Default()
	}
	_, cerr := os.Stat(certFile)
	_, kerr := os.Stat(keyFile)
	switch {
	case errors.Is(cerr, fs.ErrNotExist) && errors.Is(kerr, fs.ErrNotExist):
		ca, err := createCA(certFile, keyFile)
		if errors.Is(err, fs.ErrExist) { // another process created it first
			return LoadCA(certFile, keyFile)
		}
		if err != nil {
			return nil, err
		}
		log.Info("created the MITM certificate authority; clients must trust it for https CaptchaAI calls through the proxy (print it with `solveonce ca`)",
			"cert", certFile, "key", keyFile)
		return ca, nil
	case errors.Is(cerr, fs.ErrNotExist):
		return nil, fmt.Errorf("proxy: CA key %s exists but certificate %s does not; restore it or remove both", keyFile, certFile)
	case errors.Is(kerr, fs.ErrNotExist):
		return nil, fmt.Errorf("proxy: CA certificate %s exists but key %s does not; restore it or remove both", certFile, keyFile)
	}
	return LoadCA(certFile, keyFile)
}

// LoadCA loads an existing CA from PEM files.
func LoadCA(certFile, keyFile string) (*CA, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return nil, fmt.Errorf("proxy: read CA certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, fmt.Errorf("proxy: read CA key: %w", err)
	}
	ca, err := parseCA(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("proxy: CA %s, %s: %w", certFile, keyFile, err)
	}
	return ca, nil
}

func parseCA(certPEM, keyPEM []byte) (*CA, error) {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, err
	}
	if isBundledCA(cert) {
		return nil, ErrBundledCA
	}
	if !cert.BasicConstraintsValid || !cert.IsCA {
		return nil, errors.New("the certificate is not a CA certificate")
	}
	key, ok := pair.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("unsupported CA key type %T", pair.PrivateKey)
	}
	block := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw})
	return &CA{Cert: cert, CertPEM: block, key: key}, nil
}

// isBundledCA reports whether cert is goproxy's bundled CA, or any
// certificate for its published key.
func isBundledCA(cert *x509.Certificate) bool {
	gp := goproxy.GoproxyCa
	if len(gp.Certificate) > 0 && bytes.Equal(gp.Certificate[0], cert.Raw) {
		return true
	}
	pub, ok := cert.PublicKey.(interface{ Equal(crypto.PublicKey) bool })
	if !ok {
		return false
	}
	if s, ok := gp.PrivateKey.(crypto.Signer); ok && pub.Equal(s.Public()) {
		return true
	}
	if b, _ := pem.Decode(goproxy.CA_CERT); b != nil {
		if c, err := x509.ParseCertificate(b.Bytes); err == nil && pub.Equal(c.PublicKey) {
			return true
		}
	}
	return false
}

// NewCA returns a fresh ECDSA P-256 CA, held in memory only, and its
// private key in PEM (PKCS #8) for whoever stores it.
func NewCA() (*CA, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("proxy: generate CA key: %w", err)
	}
	now := time.Now()
	host, _ := os.Hostname()
	tmpl := &x509.Certificate{
		SerialNumber:          randomSerial(),
		Subject:               pkix.Name{CommonName: "solveonce MITM CA " + host, Organization: []string{"solveonce"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("proxy: create CA certificate: %w", err)
	}
	pk, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("proxy: encode CA key: %w", err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pk})
	ca, err := parseCA(certPEM, keyPEM)
	if err != nil {
		return nil, nil, fmt.Errorf("proxy: new CA: %w", err)
	}
	return ca, keyPEM, nil
}

// createCA makes a new CA and writes it; either file appearing meanwhile
// is an error wrapping fs.ErrExist.
func createCA(certFile, keyFile string) (*CA, error) {
	ca, keyPEM, err := NewCA()
	if err != nil {
		return nil, err
	}
	if err := writeExclusive(keyFile, keyPEM, 0o600); err != nil {
		return nil, fmt.Errorf("proxy: write CA key: %w", err)
	}
	if err := writeExclusive(certFile, ca.CertPEM, 0o644); err != nil {
		_ = os.Remove(keyFile)
		return nil, fmt.Errorf("proxy: write CA certificate: %w", err)
	}
	return ca, nil
}

// writeExclusive writes data to path atomically with mode perm, creating
// missing directories with mode 0700, and fails with fs.ErrExist rather
// than replace an existing file.
func writeExclusive(path string, data []byte, perm os.FileMode) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".tmp-"+filepath.Base(path)+"-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	if err := f.Chmod(perm); err != nil {
		_ = f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Link(tmp, path) // fails if path exists: never replaces
}

func randomSerial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail
	}
	return n.Add(n, big.NewInt(1))
}

// Sign issues an ECDSA P-256 leaf certificate for host (a DNS name or an
// IP literal), valid from an hour ago for leafValidity, never past the CA.
func (ca *CA) Sign(host string, now time.Time) (*tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("proxy: generate leaf key: %w", err)
	}
	notAfter := now.Add(leafValidity)
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber:          randomSerial(),
		Subject:               pkix.Name{CommonName: host},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	if ip := net.ParseIP(host); ip != nil {
		tmpl.IPAddresses = []net.IP{ip}
	} else {
		tmpl.DNSNames = []string{host}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, fmt.Errorf("proxy: sign leaf for %s: %w", host, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("proxy: sign leaf for %s: %w", host, err)
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

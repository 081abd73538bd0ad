package transport

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Lifetimes of the certificates CreateCA, CreateNodeCert and
// CreateClientCert make: a CA for ten years, nodes and clients for one
// (rotate them before: docs/SECURITY.md).
const (
	CALifetime   = 10 * 365 * 24 * time.Hour
	CertLifetime = 365 * 24 * time.Hour
)

// The file names of a certificate directory (nornctl cert, make cluster's
// data/certs): ca.crt and ca.key; node-<id>.crt and .key;
// client-<name>.crt and .key.
const (
	CACertFile = "ca.crt"
	CAKeyFile  = "ca.key"
)

// GossipKeyFile is the file name of the cluster's gossip key in a
// certificate directory.
const GossipKeyFile = "gossip.key"

// CreateGossipKey writes a new random 32-byte gossip key (AES-256, base64,
// mode 0600) to dir's gossip.key, refusing to overwrite one.
func CreateGossipKey(dir string) error {
	p := filepath.Join(dir, GossipKeyFile)
	if exists(p) {
		return fmt.Errorf("cert: %s exists; remove it first to make a new key (every node needs the same one)", p)
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return writeAtomic(p, []byte(base64.StdEncoding.EncodeToString(key)+"\n"), 0o600)
}

// ReadGossipKey reads a gossip key file: base64 of 16, 24 or 32 bytes.
func ReadGossipKey(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("gossip key: %w", err)
	}
	key, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, fmt.Errorf("gossip key %s: not base64: %w", path, err)
	}
	if n := len(key); n != 16 && n != 24 && n != 32 {
		return nil, fmt.Errorf("gossip key %s: %d bytes, want 16, 24 or 32", path, n)
	}
	return key, nil
}

// NodeCertFiles are the certificate and key file names of node id.
func NodeCertFiles(dir, id string) (cert, key string) {
	return filepath.Join(dir, "node-"+id+".crt"), filepath.Join(dir, "node-"+id+".key")
}

// ClientCertFiles are the certificate and key file names of user name.
func ClientCertFiles(dir, name string) (cert, key string) {
	return filepath.Join(dir, "client-"+name+".crt"), filepath.Join(dir, "client-"+name+".key")
}

// CreateCA makes a new CA (ECDSA P-256, CALifetime) in dir: ca.crt and
// ca.key (mode 0600). It refuses to overwrite an existing CA.
func CreateCA(dir, name string) error {
	certPath, keyPath := filepath.Join(dir, CACertFile), filepath.Join(dir, CAKeyFile)
	if exists(certPath) || exists(keyPath) {
		return fmt.Errorf("cert: %s already holds a CA (%s); remove it first to make a new one", dir, CACertFile)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name, Organization: []string{"Norn"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(CALifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
		SubjectKeyId:          keyID(&key.PublicKey),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return err
	}
	return writePair(dir, certPath, keyPath, der, key)
}

// CreateNodeCert makes node id's certificate, signed by the CA in dir:
// URI SAN norn://node/<id>, the hosts (DNS names or IPs) as SANs, for
// both server and client use (nodes call each other).
func CreateNodeCert(dir, id string, hosts []string) error {
	if id == "" {
		return errors.New("cert: empty node id")
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: id, Organization: []string{"Norn node"}},
		URIs:        []*url.URL{NodeURI(id)},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	cert, key := NodeCertFiles(dir, id)
	return signLeaf(dir, tmpl, cert, key)
}

// CreateClientCert makes user name's client certificate, signed by the CA
// in dir: Common Name and URI SAN norn://user/<name>, client use only.
func CreateClientCert(dir, name string) error {
	if name == "" {
		return errors.New("cert: empty user name")
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: name, Organization: []string{"Norn client"}},
		URIs:        []*url.URL{UserURI(name)},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	cert, key := ClientCertFiles(dir, name)
	return signLeaf(dir, tmpl, cert, key)
}

// signLeaf fills in tmpl's key, serial and lifetime, signs it with the CA
// in dir and writes it to certPath and keyPath (replacing older files: a
// rotation).
func signLeaf(dir string, tmpl *x509.Certificate, certPath, keyPath string) error {
	ca, err := loadCA(dir)
	if err != nil {
		return err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	tmpl.SerialNumber = serial()
	tmpl.NotBefore = now.Add(-time.Hour)
	tmpl.NotAfter = now.Add(CertLifetime)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	tmpl.SubjectKeyId = keyID(&key.PublicKey)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return err
	}
	return writePair(dir, certPath, keyPath, der, key)
}

type caPair struct {
	cert *x509.Certificate
	key  any
}

// loadCA reads dir's ca.crt and ca.key.
func loadCA(dir string) (*caPair, error) {
	certPEM, err := os.ReadFile(filepath.Join(dir, CACertFile))
	if err != nil {
		return nil, fmt.Errorf("cert: the CA: %w (nornctl cert create-ca makes one)", err)
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, CAKeyFile))
	if err != nil {
		return nil, fmt.Errorf("cert: the CA's key: %w", err)
	}
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, fmt.Errorf("cert: %s: not PEM", dir)
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("cert: the CA: %w", err)
	}
	key, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("cert: the CA's key: %w", err)
	}
	return &caPair{cert: cert, key: key}, nil
}

// writePair writes a certificate (0644) and its key (0600), each through a
// temporary file renamed into place, so a node reloading never reads half
// a file.
func writePair(dir, certPath, keyPath string, der []byte, key *ecdsa.PrivateKey) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	if err := writeAtomic(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		return err
	}
	return writeAtomic(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
}

func writeAtomic(path string, b []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, mode); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail
	}
	return n
}

func keyID(pub *ecdsa.PublicKey) []byte {
	b, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil
	}
	sum := sha256.Sum256(b)
	return sum[:20]
}

#!/usr/bin/env bash
# Make the TLS material for Kafka's EXTERNAL listener (docs/operations.md, "TLS on the external
# listener"): the market's own certificate authority, the broker's certificate and keystore,
# and what clients trust.
#
#   deploy/make-tls.sh --host market.example.org [--host 203.0.113.7] [--out tls] [--days 825]
#
# In --out (default ./tls, mode 0700):
#   ca.pem, ca.key            the CA (ca.key signs broker certificates: keep it offline)
#   broker.pem, broker.key    the broker's certificate, valid for `kafka`, `localhost`,
#                             127.0.0.1 and every --host (EMARKET_PUBLIC_HOST)
#   broker.p12                the broker's keystore (PKCS12: key, certificate, CA)
#   keystore.password         its password (KAFKA_SSL_KEYSTORE_PASSWORD, _KEY_PASSWORD)
#   truststore.p12            the CA for Java clients (PKCS12, password in
#                             truststore.password), made with keytool when it is installed
# Python clients (the CLI, the client library) trust ca.pem: EMARKET_KAFKA_CA=ca.pem.
#
# Running it again keeps the CA (clients keep trusting it) and issues a new broker
# certificate and keystore: the way to renew one, or to add a host name.
set -euo pipefail
out=tls days=825 hosts=()
while [ $# -gt 0 ]; do
  case "$1" in
    --host) hosts+=("$2"); shift 2 ;;
    --out) out=$2; shift 2 ;;
    --days) days=$2; shift 2 ;;
    *) echo "usage: $0 --host NAME [--host NAME...] [--out DIR] [--days N]" >&2; exit 2 ;;
  esac
done
[ ${#hosts[@]} -gt 0 ] || { echo "name the host clients connect to: --host NAME" >&2; exit 2; }
san="DNS:kafka,DNS:localhost,IP:127.0.0.1"
for h in "${hosts[@]}"; do
  if [[ $h =~ ^[0-9]+(\.[0-9]+){3}$ || $h == *:* ]]; then san+=",IP:$h"
  elif [[ $h =~ ^[A-Za-z0-9*]([A-Za-z0-9.-]*[A-Za-z0-9])?$ ]]; then san+=",DNS:$h"
  else echo "not a host name or address: '$h'" >&2; exit 2; fi
done
umask 077
mkdir -p "$out"
cd "$out"
secret() { head -c 24 /dev/urandom | base64 | tr -d '\n+/='; }
curve=(-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes)
if [ ! -f ca.key ]; then
  openssl req -x509 "${curve[@]}" -keyout ca.key -out ca.pem -days 3650 -sha256 \
    -subj "/CN=epsilon-market CA" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
  echo "made a new CA: ca.pem (give it to clients), ca.key (keep it offline)" >&2
fi
openssl req -new "${curve[@]}" -keyout broker.key -out broker.csr -subj "/CN=kafka" 2>/dev/null
printf '%s\n' "subjectAltName=$san" "basicConstraints=critical,CA:FALSE" \
  "keyUsage=critical,digitalSignature,keyEncipherment" "extendedKeyUsage=serverAuth" \
  > broker.ext
openssl x509 -req -in broker.csr -CA ca.pem -CAkey ca.key -set_serial "0x$(openssl rand -hex 16)" \
  -days "$days" -sha256 -extfile broker.ext -out broker.pem 2>/dev/null
rm -f broker.csr broker.ext
[ -s keystore.password ] || secret > keystore.password
openssl pkcs12 -export -name kafka -in broker.pem -inkey broker.key -certfile ca.pem \
  -out broker.p12 -passout file:keystore.password
if command -v keytool >/dev/null; then
  [ -s truststore.password ] || secret > truststore.password
  rm -f truststore.p12
  keytool -importcert -noprompt -alias epsilon-market-ca -file ca.pem -keystore truststore.p12 \
    -storetype PKCS12 -storepass:file truststore.password >/dev/null
else
  echo "keytool not found: no truststore.p12. Java clients can trust ca.pem directly" \
       "(ssl.truststore.type=PEM, ssl.truststore.location=ca.pem), or make one where keytool" \
       "is installed: docs/operations.md, \"TLS on the external listener\"" >&2
fi
chmod 644 ca.pem broker.pem
[ ! -f truststore.p12 ] || chmod 644 truststore.p12
echo "broker certificate for $san, valid $days days: $(pwd)/broker.pem, keystore broker.p12" >&2

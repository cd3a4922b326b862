# shellcheck shell=bash
# The local Kafka's encrypted and authenticated listeners, beside the PLAINTEXT one that the rest
# of the stack, the brokers among themselves and the tests keep using. Sourced by infra/kafka.sh
# once KAFKA_NODES is known (needs infra/lib.sh).
#
#   SASL_SSL  127.0.0.1:9192  TLS, then SCRAM-SHA-512 as user `tidegate` (the admin), or as the
#                             principal of one component: `tidegate-gateway`, `tidegate-worker`, ...
#   MTLS      127.0.0.1:9193  TLS with a client certificate required (security.protocol=SSL)
#
# On these listeners the broker's StandardAuthorizer allows each component's principal only what
# `tidegate stack acls` lists (core/kafka_acls.py, docs/security.md). The admin (`tidegate`, by
# password or by the client certificate's CN) and the loopback PLAINTEXT listener, which the local
# stack's own processes and the tests use, are super users.
#
# KAFKA_SECURITY=sasl_ssl adds them, KAFKA_SECURITY=none leaves only PLAINTEXT. The default is
# sasl_ssl on the single node at the default port 9092 (`make up`, so CI runs its test) and none
# anywhere else: a second stack on ports of its own would otherwise fight the first for 9192/9193
# (TIDEGATE_STACK_KAFKA_SASL_SSL_PORT and TIDEGATE_STACK_KAFKA_MTLS_PORT move them).
#
# Made once with openssl, into $STACK_VAR/kafka/tls (mode 700, git-ignored like all of var/):
#   ca.crt, ca.key           a CA of this stack alone
#   broker.p12               the broker's key and certificate (127.0.0.1, localhost), for Java
#   client.crt, client.key   the mTLS client's certificate and its key, encrypted
#   *.password               the keystore's, the client key's and the SCRAM user's passwords
#   sasl-ssl.env, mtls.env   TIDEGATE_KAFKA_* settings for each listener (`set -a; . FILE`)
#   <component>.env          SASL_SSL settings of that component's principal (scram-<component>.password)
# Deleting the folder makes new ones on the next start. No secret is ever printed.

KAFKA_TLS_DIR=$KAFKA_ROOT/tls
KAFKA_SASL_SSL_PORT=${TIDEGATE_STACK_KAFKA_SASL_SSL_PORT:-9192}
KAFKA_MTLS_PORT=${TIDEGATE_STACK_KAFKA_MTLS_PORT:-9193}
KAFKA_SCRAM_USER=tidegate
# Each has the SCRAM user tidegate-<component> and the ACLs of core/kafka_acls.py.
KAFKA_COMPONENTS=(gateway worker controller registry operator producer)
KAFKA_TLS_FILES=(ca.crt ca.key broker.p12 broker.password client.crt client.key
  client.key.password scram.password)
for c in "${KAFKA_COMPONENTS[@]}"; do KAFKA_TLS_FILES+=("scram-$c.password"); done

if [[ -z "${KAFKA_SECURITY:-}" ]]; then
  KAFKA_SECURITY=none
  if ((KAFKA_NODES == 1)) && [[ "$KAFKA_PORT" == 9092 ]]; then KAFKA_SECURITY=sasl_ssl; fi
fi
case "$KAFKA_SECURITY" in
none | sasl_ssl) ;;
*) die "kafka: KAFKA_SECURITY must be sasl_ssl or none, not '$KAFKA_SECURITY'" ;;
esac

kafka_secure() { [[ "$KAFKA_SECURITY" == sasl_ssl ]] && ((KAFKA_NODES == 1)); }

# kafka_tls_preflight: before anything starts (never on `down` or `status`, which must work anyway).
kafka_tls_preflight() {
  if [[ "$KAFKA_SECURITY" == sasl_ssl ]] && ((KAFKA_NODES != 1)); then
    die "kafka: KAFKA_SECURITY=sasl_ssl runs on the single node only"
  fi
  if kafka_secure && ! command -v openssl >/dev/null; then
    die "kafka: openssl not found (apt-get install openssl), or start with KAFKA_SECURITY=none"
  fi
}

# kafka_tls_listening: the KN_* node was started with the secure listeners (its config has them).
kafka_tls_listening() { grep -q '^listeners=.*SASL_SSL://' "$KN_DIR/server.properties" 2>/dev/null; }

# kafka_tls_make DIR: a new CA, broker and client certificate and the passwords, in DIR.
kafka_tls_make() {
  local dir=$1 f
  cat >"$dir/openssl.cnf" <<'EOF'
[req]
distinguished_name = dn
prompt = no
[dn]
CN = tidegate
[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
[broker]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1, DNS:localhost
authorityKeyIdentifier = keyid
[client]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = clientAuth
authorityKeyIdentifier = keyid
EOF
  for f in broker client.key scram "${KAFKA_COMPONENTS[@]/#/scram-}"; do
    openssl rand -hex 24 >"$dir/$f.password"
  done
  local ec=(-newkey ec -pkeyopt ec_paramgen_curve:P-256)
  openssl req -x509 -config "$dir/openssl.cnf" -extensions ca "${ec[@]}" -noenc \
    -keyout "$dir/ca.key" -out "$dir/ca.crt" -days 3650 -subj "/CN=tidegate local Kafka CA"
  openssl req -new -config "$dir/openssl.cnf" "${ec[@]}" -noenc \
    -keyout "$dir/broker.key" -out "$dir/broker.csr" -subj "/CN=localhost"
  openssl x509 -req -in "$dir/broker.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" \
    -CAcreateserial -days 825 -extfile "$dir/openssl.cnf" -extensions broker -out "$dir/broker.crt"
  # PKCS#12 is what the broker's JVM reads; the key inside is encrypted with the store password.
  openssl pkcs12 -export -in "$dir/broker.crt" -inkey "$dir/broker.key" -certfile "$dir/ca.crt" \
    -name broker -passout "file:$dir/broker.password" -out "$dir/broker.p12"
  openssl req -new -config "$dir/openssl.cnf" "${ec[@]}" \
    -passout "file:$dir/client.key.password" -keyout "$dir/client.key" -out "$dir/client.csr" \
    -subj "/CN=$KAFKA_SCRAM_USER"
  openssl x509 -req -in "$dir/client.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" \
    -CAcreateserial -days 825 -extfile "$dir/openssl.cnf" -extensions client -out "$dir/client.crt"
  rm -f "$dir/broker.key" "$dir"/*.csr "$dir"/*.srl
}

# kafka_tls_setup: makes the certificates and passwords unless all are there (a folder left
# half-made by an interrupted run is made again, whole).
kafka_tls_setup() {
  local f missing=0 tmp log=$KAFKA_ROOT/logs/tls.log
  for f in "${KAFKA_TLS_FILES[@]}"; do [[ -s "$KAFKA_TLS_DIR/$f" ]] || missing=1; done
  ((missing)) || return 0
  mkdir -p "$KAFKA_ROOT/logs"
  tmp=$(mktemp -d "$KAFKA_ROOT/tls.XXXXXX")
  # openssl's output names no secret (passwords go through files); it goes to the log only.
  if ! (umask 077 && kafka_tls_make "$tmp") >"$log" 2>&1; then
    rm -rf "$tmp"
    fail_with_log kafka "$log" "making the TLS certificates failed"
  fi
  chmod 700 "$tmp"
  rm -rf "$KAFKA_TLS_DIR"
  mv "$tmp" "$KAFKA_TLS_DIR"
  log "kafka: made a CA, broker and client certificates and the SCRAM password in $KAFKA_TLS_DIR"
}

# kafka_tls_configure: the listeners' lines of server.properties (appended, so they override the
# template's), and the clients' env files. The file then holds the keystore password: mode 600.
kafka_tls_configure() {
  local props=$KN_DIR/server.properties d=$KAFKA_TLS_DIR
  local plain=PLAINTEXT://$STACK_HOST:$KN_PORT
  local secure="SASL_SSL://$STACK_HOST:$KAFKA_SASL_SSL_PORT,MTLS://$STACK_HOST:$KAFKA_MTLS_PORT"
  chmod 600 "$props"
  cat >>"$props" <<EOF

# infra/kafka-tls.sh (KAFKA_SECURITY=sasl_ssl): SASL_SSL with SCRAM-SHA-512, and TLS with client
# certificates required; brokers and the controller keep to PLAINTEXT.
listeners=$plain,CONTROLLER://$STACK_HOST:$KN_CONTROLLER_PORT,$secure
advertised.listeners=$plain,$secure
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL,MTLS:SSL
listener.name.sasl_ssl.sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.mtls.ssl.client.auth=required
# The client certificate's CN is the principal (CN=tidegate is User:tidegate, the admin).
ssl.principal.mapping.rules=RULE:^CN=([^,]+)$/\$1/,DEFAULT
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users=User:ANONYMOUS;User:$KAFKA_SCRAM_USER
ssl.keystore.type=PKCS12
ssl.keystore.location=$d/broker.p12
ssl.keystore.password=$(<"$d/broker.password")
ssl.key.password=$(<"$d/broker.password")
ssl.truststore.type=PEM
ssl.truststore.location=$d/ca.crt
EOF
  (
    umask 077
    cat >"$d/sasl-ssl.env" <<EOF
TIDEGATE_KAFKA_BOOTSTRAP_SERVERS=$STACK_HOST:$KAFKA_SASL_SSL_PORT
TIDEGATE_KAFKA_SECURITY_PROTOCOL=SASL_SSL
TIDEGATE_KAFKA_SASL_MECHANISM=SCRAM-SHA-512
TIDEGATE_KAFKA_SASL_USERNAME=$KAFKA_SCRAM_USER
TIDEGATE_KAFKA_SASL_PASSWORD=$(<"$d/scram.password")
TIDEGATE_KAFKA_SSL_CA_LOCATION=$d/ca.crt
EOF
    local c
    for c in "${KAFKA_COMPONENTS[@]}"; do
      {
        grep -v '^TIDEGATE_KAFKA_SASL_\(USERNAME\|PASSWORD\)=' "$d/sasl-ssl.env"
        echo "TIDEGATE_KAFKA_SASL_USERNAME=tidegate-$c"
        echo "TIDEGATE_KAFKA_SASL_PASSWORD=$(<"$d/scram-$c.password")"
      } >"$d/$c.env"
    done
    cat >"$d/mtls.env" <<EOF
TIDEGATE_KAFKA_BOOTSTRAP_SERVERS=$STACK_HOST:$KAFKA_MTLS_PORT
TIDEGATE_KAFKA_SECURITY_PROTOCOL=SSL
TIDEGATE_KAFKA_SSL_CA_LOCATION=$d/ca.crt
TIDEGATE_KAFKA_SSL_CERTIFICATE_LOCATION=$d/client.crt
TIDEGATE_KAFKA_SSL_KEY_LOCATION=$d/client.key
TIDEGATE_KAFKA_SSL_KEY_PASSWORD=$(<"$d/client.key.password")
EOF
  )
}

# kafka_tls_users: once the broker is healthy, sets the SCRAM users (through the PLAINTEXT
# listener's admin API: no password reaches a command line) and checks both secure listeners.
# Done again only when the storage was formatted anew or the passwords made anew: the marker holds
# the storage's directory.id and is kept in the folder of the passwords. The components' ACLs are
# applied on every start (creating one that exists changes nothing), so a new table takes effect.
kafka_tls_users() {
  local out c envs=()
  if ! kafka_tls_listening; then
    log "kafka: runs without the SASL_SSL and mTLS listeners (started before they were added);" \
      "\`make down && make up\` adds them"
    return 0
  fi
  # Every start, not once per storage: this single node has come back from a restart without
  # the SCRAM users it had (Kafka 4.1.1), and a marker then hid it until a client failed. The
  # upsert keeps each password, and the script checks that both listeners answer.
  rm -f "$KAFKA_TLS_DIR/users.done"  # the marker earlier versions of this script kept
  for c in "${KAFKA_COMPONENTS[@]}"; do envs+=("$KAFKA_TLS_DIR/$c.env"); done
  # librdkafka's lines (stderr) go to the log; stdout is the one line of the outcome.
  out=$("$STACK_BIN/python" "$STACK_INFRA/kafka_users.py" "$KAFKA_SCRAM_USER" \
    "$KAFKA_TLS_DIR/sasl-ssl.env" "$KAFKA_TLS_DIR/mtls.env" "${envs[@]}" \
    2>>"$KAFKA_ROOT/logs/tls.log") ||
    fail_with_log kafka "$KAFKA_ROOT/logs/tls.log" "the SASL_SSL and mTLS listeners are not usable"
  log "kafka: $out"
  out=$("$STACK_BIN/tidegate" stack acls --apply --prune 2>>"$KAFKA_ROOT/logs/tls.log") ||
    fail_with_log kafka "$KAFKA_ROOT/logs/tls.log" "applying the components' ACLs failed"
  log "kafka: ${out##*$'\n'}"
}

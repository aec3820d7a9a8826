#!/bin/sh
# A throw-away CA and the broker's certificate (PEM, key in PKCS#8) for the compose example.
# Real deployments use certificates from their own CA.
set -eu
cd /certs
[ -f kafka.pem ] && exit 0
openssl req -x509 -newkey rsa:2048 -nodes -days 825 -subj "/CN=freshplan-example-ca" -keyout ca.key -out ca.pem
openssl req -newkey rsa:2048 -nodes -subj "/CN=kafka" -keyout kafka.key -out kafka.csr
printf "subjectAltName=DNS:kafka,DNS:localhost\n" > san.ext
openssl x509 -req -in kafka.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 825 -extfile san.ext -out kafka.crt
openssl pkcs8 -topk8 -nocrypt -in kafka.key -out kafka.pk8
cat kafka.pk8 kafka.crt > kafka.pem
rm -f kafka.csr kafka.key kafka.pk8 san.ext ca.key
chmod 644 ca.pem kafka.pem

#!/usr/bin/env bash
# Serving certificate for manifests/overlays/self-managed, without cert-manager.
#
#   kubectl apply -k manifests/overlays/self-managed          (step 1: no webhook configurations yet)
#   hack/install-self-managed-certs.sh [--namespace gpuquota-system] [--kubeconfig FILE] [--context NAME]
#   kubectl kustomize manifests/webhooks | gpuquota preflight --install -f -   (step 2, with this CA)
#
# 1. checks that the webhook configurations that exist call <service>.<namespace> (on a first
#    install there are none yet: `gpuquota preflight --install` writes them later, with the CA of the
#    Secret as caBundle);
# 2. `gpuquota certs generate` makes a fresh CA and a certificate for that Service in a private
#    temporary directory, removed on exit (the CA key never leaves this machine, and is gone after
#    the run: nobody can sign another certificate with it);
# 3. patches the CA into caBundle of every webhook of the configurations that exist, one JSON patch per
#    configuration with a `test` of each webhook's name, so a reordered list fails instead of
#    getting the wrong field patched;
# 4. creates or updates the kubernetes.io/tls Secret (tls.crt, tls.key, ca.crt) that the
#    Deployment mounts; `gpuquota serve` reloads the files when the kubelet updates the mount.
#
# Running it again rotates everything (that is also how you renew: the certificate is valid for 365
# days). So that no call fails while the pods still serve the previous certificate, caBundle then
# holds the new CA AND the CA in the Secret until now; the run after drops that one again. Step 3
# comes before step 4 for the same reason.
#
# The private key is never printed: it goes from the temporary directory into the Secret through a
# pipe. The Secret is applied server-side, so no copy of it lands in the
# kubectl.kubernetes.io/last-applied-configuration annotation either.
set -euo pipefail

readonly PROG="${0##*/}"
readonly FIELD_MANAGER="gpuquota-install-certs"
readonly KINDS=(mutatingwebhookconfiguration validatingwebhookconfiguration)

usage() {
  cat <<EOF
Usage: $PROG [options]

Generate a CA and serving certificate for the gpuquota webhook, store them in its TLS Secret and
put the CA into caBundle of every webhook of the webhook configurations that exist (none on a first
install: gpuquota preflight --install writes them with this CA). Idempotent: each run rotates the
certificate. Apply manifests/overlays/self-managed first.

Options:
  -n, --namespace NS          namespace of the webhook Service and Secret (default: gpuquota-system)
      --kubeconfig FILE       kubeconfig for kubectl (default: kubectl's own lookup)
      --context NAME          kubeconfig context (default: the current one)
      --service NAME          webhook Service (default: gpuquota-webhook)
      --secret NAME           TLS Secret the Deployment mounts (default: gpuquota-webhook-tls)
      --configuration NAME    name of the Mutating- and ValidatingWebhookConfiguration
                              (default: gpuquota-webhook)
      --gpuquota PATH         the gpuquota command (default: \$GPUQUOTA, else gpuquota on PATH)
  -h, --help                  this message
EOF
}

die() {
  echo "$PROG: $*" >&2
  exit 1
}

usage_error() {
  echo "$PROG: $*" >&2
  echo "Try '$PROG --help'." >&2
  exit 2
}

namespace="gpuquota-system"
service="gpuquota-webhook"
secret="gpuquota-webhook-tls"
configuration="gpuquota-webhook"
kubeconfig=""
context=""
gpuquota="${GPUQUOTA:-gpuquota}"

while (($# > 0)); do
  option="$1"
  value=""
  case "$option" in
    -h | --help)
      usage
      exit 0
      ;;
    --*=*)
      value="${option#*=}"
      option="${option%%=*}"
      shift
      ;;
    -n | --namespace | --kubeconfig | --context | --service | --secret | --configuration | --gpuquota)
      (($# >= 2)) || usage_error "$option needs a value"
      value="$2"
      shift 2
      ;;
    *)
      usage_error "unknown argument: $option"
      ;;
  esac
  [[ -n "$value" ]] || usage_error "$option needs a non-empty value"
  case "$option" in
    -n | --namespace) namespace="$value" ;;
    --kubeconfig) kubeconfig="$value" ;;
    --context) context="$value" ;;
    --service) service="$value" ;;
    --secret) secret="$value" ;;
    --configuration) configuration="$value" ;;
    --gpuquota) gpuquota="$value" ;;
    *) usage_error "unknown option: $option" ;;
  esac
done

command -v kubectl >/dev/null || die "kubectl not found on PATH"
command -v "$gpuquota" >/dev/null || die "$gpuquota not found (install the package, or give --gpuquota PATH)"

kubectl=(kubectl)
[[ -z "$kubeconfig" ]] || kubectl+=(--kubeconfig "$kubeconfig")
[[ -z "$context" ]] || kubectl+=(--context "$context")

# -- 1. the configurations exist and call the Service the certificate will be for -------------------
"${kubectl[@]}" get namespace "$namespace" -o name >/dev/null ||
  die "cannot read namespace $namespace (apply manifests/overlays/self-managed first, or see --namespace)"
declare -A webhook_names=()
installed_kinds=()
for kind in "${KINDS[@]}"; do
  # --ignore-not-found: a missing configuration prints nothing and exits 0; any other failure stops.
  if ! listing="$("${kubectl[@]}" get "$kind" "$configuration" --ignore-not-found -o \
    jsonpath='{range .webhooks[*]}{.name}{" "}{.clientConfig.service.namespace}{"/"}{.clientConfig.service.name}{"\n"}{end}')"; then
    die "cannot read $kind/$configuration"
  fi
  if [[ -z "$listing" ]] && ! "${kubectl[@]}" get "$kind" "$configuration" -o name >/dev/null 2>&1; then
    echo "$PROG: $kind/$configuration is not installed yet; gpuquota preflight --install writes it with this CA" >&2
    continue
  fi
  names=()
  while read -r name target; do
    [[ -n "$name" ]] || continue
    # Webhook names are DNS-style (the apiserver insists); anything else would need JSON escaping.
    [[ "$name" =~ ^[A-Za-z0-9.-]+$ ]] || die "$kind/$configuration: unexpected webhook name '$name'"
    [[ "$target" == "$namespace/$service" ]] ||
      die "$kind/$configuration: webhook $name calls service '$target', but the certificate would be for $namespace/$service (see --namespace, --service)"
    names+=("$name")
  done <<<"$listing"
  ((${#names[@]} > 0)) || die "$kind/$configuration has no webhooks"
  webhook_names[$kind]="${names[*]}"
  installed_kinds+=("$kind")
done

# The CA that signed what the pods serve right now (empty on the first run).
previous_ca="$("${kubectl[@]}" get secret "$secret" --namespace "$namespace" --ignore-not-found \
  -o jsonpath='{.data.ca\.crt}')"

# -- 2. a fresh CA and serving certificate --------------------------------------------------------
workdir="$(mktemp -d)"
trap 'rm -rf -- "$workdir"' EXIT
chmod 700 "$workdir"
# stdout is the CA's caBundle (base64 of ca.crt); the file list goes to stderr.
ca_bundle="$("$gpuquota" certs generate --service "$service" --namespace "$namespace" --out "$workdir/certs")"
[[ -s "$workdir/certs/tls.key" && -n "$ca_bundle" ]] || die "gpuquota certs generate wrote no certificate"

bundle="$ca_bundle"
if [[ -n "$previous_ca" && "$previous_ca" != "$ca_bundle" ]]; then
  bundle="$({ printf '%s' "$ca_bundle" | base64 -d && printf '%s' "$previous_ca" | base64 -d; } | base64 | tr -d '\n')"
  echo "$PROG: caBundle trusts the new CA and, until the next run, the one in Secret $namespace/$secret" >&2
fi

# -- 3. caBundle of every webhook -----------------------------------------------------------------
for kind in "${installed_kinds[@]}"; do
  read -r -a names <<<"${webhook_names[$kind]}"
  patch=""
  for index in "${!names[@]}"; do
    patch+="${patch:+,}{\"op\":\"test\",\"path\":\"/webhooks/$index/name\",\"value\":\"${names[$index]}\"}"
    # add replaces an existing member, so this works with and without a caBundle already there.
    patch+=",{\"op\":\"add\",\"path\":\"/webhooks/$index/clientConfig/caBundle\",\"value\":\"$bundle\"}"
  done
  "${kubectl[@]}" patch "$kind" "$configuration" --type=json --patch "[$patch]"
done

# -- 4. the Secret --------------------------------------------------------------------------------
"${kubectl[@]}" create secret generic "$secret" --namespace "$namespace" --type=kubernetes.io/tls \
  --from-file=tls.crt="$workdir/certs/tls.crt" \
  --from-file=tls.key="$workdir/certs/tls.key" \
  --from-file=ca.crt="$workdir/certs/ca.crt" \
  --dry-run=client -o yaml |
  "${kubectl[@]}" label --local -f - app.kubernetes.io/name=koord-gpuquota -o yaml |
  "${kubectl[@]}" apply --server-side --field-manager="$FIELD_MANAGER" --force-conflicts -f -

echo "$PROG: done; the webhook pods pick up the new certificate when the kubelet refreshes the Secret (about a minute)" >&2

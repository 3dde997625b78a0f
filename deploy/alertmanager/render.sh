#!/bin/sh
# Alertmanager's entrypoint in docker-compose.yml: write the environment's receiver URLs into
# its configuration, then start it.
#
#   render.sh TEMPLATE OUTPUT COMMAND...
#
# Every ${EMARKET_ALERT_*} in TEMPLATE is replaced by that variable's value, verbatim (a URL
# may hold any character, so no sed). A variable that is unset or empty stops the start,
# naming it: an alert route without a destination must not look configured.
set -eu
template=$1 output=$2
shift 2
awk '
  {
    for (k in ENVIRON) {
      if (k !~ /^EMARKET_ALERT_[A-Z_]+$/ || ENVIRON[k] == "") continue
      token = "${" k "}"
      line = ""
      while ((i = index($0, token)) > 0) {
        line = line substr($0, 1, i - 1) ENVIRON[k]
        $0 = substr($0, i + length(token))
      }
      $0 = line $0
    }
    print
  }
' "$template" > "$output.tmp"
if missing=$(grep -o '\${EMARKET_ALERT_[A-Z_]*}' "$output.tmp" | sort -u | tr '\n' ' ') \
    && [ -n "$missing" ]; then
  echo "render.sh: set $missing(docs/operations.md, \"Alerts\")" >&2
  rm -f "$output.tmp"
  exit 2
fi
mv "$output.tmp" "$output"
[ $# -eq 0 ] || exec "$@"

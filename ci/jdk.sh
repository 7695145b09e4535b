# Sourced by the ci/ scripts and ./gin4j: exports JAVA_HOME pointing at a JDK >= 22.
# Order: $JAVA_HOME, then the newest JDK under /usr/lib/jvm.
gin4j_java_feature() { "$1/bin/java" -XshowSettings:properties -version 2>&1 | sed -n 's/^ *java.specification.version = //p'; }
gin4j_find_jdk() {
  local c v
  for c in "${JAVA_HOME:-}" $(ls -d /usr/lib/jvm/*/ 2>/dev/null | sort -rV); do
    c=${c%/}
    [ -n "$c" ] && [ -x "$c/bin/javac" ] && [ -x "$c/bin/jlink" ] || continue
    v=$(gin4j_java_feature "$c")
    if [ -n "$v" ] && [ "${v%%.*}" -ge 22 ] 2>/dev/null; then export JAVA_HOME="$c"; return 0; fi
  done
  echo "gin4j needs a JDK 22 or newer (built and tested with 25): none found in JAVA_HOME='${JAVA_HOME:-}' or /usr/lib/jvm. Install one (e.g. Temurin 25) and set JAVA_HOME." >&2
  return 1
}

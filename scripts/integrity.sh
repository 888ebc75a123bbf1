# Sourced by the fetch scripts: verify FILE INTEGRITY checks a downloaded npm tarball against its pinned
# `npm view <package>@<version> dist.integrity` (sha512, base64) and exits 1 naming both on a mismatch.
verify() {
    local got
    got="sha512-$(openssl dgst -sha512 -binary "$1" | base64 -w0)"
    if [[ "$got" != "$2" ]]; then
        log "integrity mismatch for $1"; log "  expected $2"; log "  got      $got"
        exit 1
    fi
}

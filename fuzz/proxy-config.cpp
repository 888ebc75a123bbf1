// Fuzz target: the settings file of `keepwarm proxy` (TOML, docs/proxy.md). Any mistake must stop with a
// proxy_config_error naming the line and column, never with a crash or another exception.
#include <string>

#include "fuzz-support.h"
#include "proxy/proxy-config.h"

using namespace keepwarm;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    try {
        proxy::parse_proxy_config(fuzz::as_text(data, size), "fuzz-proxy.toml", "/etc/keepwarm");
    } catch (const proxy::proxy_config_error&) {
        // the file's documented rejection
    } catch (const std::exception& e) {
        fuzz::finding(std::string("parse_proxy_config threw other than proxy_config_error: ") + e.what());
    }
    return 0;
}

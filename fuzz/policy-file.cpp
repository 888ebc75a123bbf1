// Fuzz target: the policy file (TOML, docs/policy.md). Any mistake must stop with a policy_file_error naming the
// line and column, never with a crash or another exception.
#include <string>

#include "fuzz-support.h"
#include "policy/policy-file.h"

using namespace keepwarm;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    try {
        policy::parse_policy(fuzz::as_text(data, size), "fuzz-policy.toml", "served-model");
    } catch (const policy::policy_file_error&) {
        // the file's documented rejection
    } catch (const std::exception& e) {
        fuzz::finding(std::string("parse_policy threw other than policy_file_error: ") + e.what());
    }
    return 0;
}

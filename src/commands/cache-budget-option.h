// --cache-ram and --cache-disk as llama-server reads them: a bare number is MiB (`--cache-ram 8192` is 8 GiB), a
// number with a unit (8GiB, 512MB, 1.5GiB; units are binary: MB = MiB) is that size, and -1 is llama-server's
// "no limit", which keepwarm, whose tiers are always bounded, reads as half of what the machine has (resolved at
// start-up: half the physical memory, half the disk's free space). A settings file's value follows the same rule.
// Threading: pure functions; safe from any thread.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

namespace keepwarm {

// A budget before start-up resolves -1: bytes, or nullopt for "no limit" (half of the machine's).
using cache_budget = std::optional<uint64_t>;

// Parses `text` (see above). Throws std::invalid_argument saying what is wrong, with `option` in the message.
cache_budget parse_cache_budget(std::string_view text, const std::string& option);

// Adds `name` (e.g. "-cram,--cache-ram" minus CLI11's limits: "--cache-ram") writing into `budget`; the help says the
// rule above after `what`.
CLI::Option* add_cache_budget_option(CLI::App& cmd, const std::string& name, cache_budget& budget,
                                     const std::string& what);

// Half of this machine's physical memory: --cache-ram -1.
uint64_t half_of_physical_memory();
// Half of the space free to this user on the disk of `dir` (or its nearest existing parent): --cache-disk -1.
uint64_t half_of_free_disk(const std::filesystem::path& dir);

// "8 GiB", "512 MiB", "1.5 GiB", "0 B": a size for people.
std::string format_bytes(uint64_t bytes);

}  // namespace keepwarm

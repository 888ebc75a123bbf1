// Files that hold API keys (a keys file, a settings file with a key in it) are checked at start-up for a mode that lets
// other users on the host read them, as ssh does with a private key; keepwarm warns and starts (a container's or a
// shared volume's modes are often not the operator's to choose), naming the file and the fix.
// Threading: a pure function of the file's mode; safe from any thread.
#pragma once

#include <string>

namespace keepwarm::config {

// The warning for the file at `path` (`what` names it in the text: "API keys file") when its group or others may
// read it: "API keys file 'keys.txt' is readable by group and others (mode 0644): other users on this host can read
// its keys; run chmod 600 keys.txt". Empty when only its owner can read it, or when it cannot be examined (reading it
// reports that).
std::string readable_by_others_warning(const std::string& path, const std::string& what);

}  // namespace keepwarm::config

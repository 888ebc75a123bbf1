// See key-file-mode.h.
#include "config/key-file-mode.h"

#include <sys/stat.h>

#include <cstdio>
#include <string_view>

namespace keepwarm::config {

std::string readable_by_others_warning(const std::string& path, const std::string& what) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return "";
    const bool group = (st.st_mode & S_IRGRP) != 0;
    const bool others = (st.st_mode & S_IROTH) != 0;
    if (!group && !others) return "";
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    const std::string who = group && others ? "group and others" : group ? "its group" : "others";
    bool plain = !path.empty();
    for (const char c : path) {
        plain = plain && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                          std::string_view("._/-+:,=@").find(c) != std::string_view::npos);
    }
    return what + " '" + path + "' is readable by " + who + " (mode " + mode +
           "): other users on this host can read its keys; run chmod 600 " + (plain ? path : "'" + path + "'");
}

}  // namespace keepwarm::config

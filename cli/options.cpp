#include <string>

#include "commands.h"

namespace idem::cli {

CLI::Option* add_store_option(CLI::App& app, std::string& url) {
  return app
      .add_option("--store", url,
                  "Store URL: memory:, sqlite:///path.db, postgresql://..., redis://... "
                  "(default: $IDEM_STORE, else $XDG_STATE_HOME/idem/idem.db or "
                  "~/.local/state/idem/idem.db)")
      ->type_name("URL");
}

CLI::Option* add_scope_option(CLI::App& app, std::string& scope) {
  return app.add_option("--scope", scope, "Namespace of the key")
      ->capture_default_str()
      ->type_name("S");
}

}  // namespace idem::cli

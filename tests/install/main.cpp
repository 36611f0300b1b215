// Uses the installed library the way an application would: open a store from a URL and run
// an action twice under one key. Exits 0 only if the second run replayed the first.
#include <idem/idem.h>

#include <cstdio>
#include <filesystem>
#include <string>

int main(int argc, char** argv) {
  const std::string path = argc > 1 ? argv[1] : "consumer.db";
  std::filesystem::remove(path);
  idem::Executor executor(idem::open_store("sqlite://" + std::filesystem::absolute(path).string()));
  int runs = 0;
  auto action = [&](const idem::Attempt&) {
    ++runs;
    return std::string("hello");
  };
  auto first = executor.run("consumer", "k", action);
  auto second = executor.run("consumer", "k", action);
  const bool ok = runs == 1 && !first.replayed && second.replayed && second.value == "hello";
  std::printf("%s\n", ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}

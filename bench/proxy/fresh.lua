-- wrk: POST requests, each with an Idempotency-Key never used before (every request is
-- forwarded and its answer recorded). RUN_ID keeps keys apart between runs on one store.
local delay = os.getenv("DELAY_MS") or "0"
local run = os.getenv("RUN_ID") or tostring(os.time())
local body = '{"amount":10,"currency":"EUR"}'
local n = 0
local threads = 0

function setup(thread)
  threads = threads + 1
  thread:set("thread_id", threads)
end

request = function()
  n = n + 1
  local key = run .. "-" .. (thread_id or 0) .. "-" .. n
  return wrk.format("POST", "/pay", {["Content-Type"] = "application/json",
                                     ["X-Test-Delay-Ms"] = delay,
                                     ["Idempotency-Key"] = key}, body)
end

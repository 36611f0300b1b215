-- wrk: POST requests cycling over KEYS Idempotency-Keys (default 100) that were answered
-- before, so every request is a replay of a recorded answer. Run once unmeasured to record
-- them (proxy_bench.sh does).
local delay = os.getenv("DELAY_MS") or "0"
local run = os.getenv("RUN_ID") or "replay"
local keys = tonumber(os.getenv("KEYS") or "100")
local body = '{"amount":10,"currency":"EUR"}'
local n = 0

request = function()
  n = n + 1
  local key = run .. "-hot-" .. (n % keys)
  return wrk.format("POST", "/pay", {["Content-Type"] = "application/json",
                                     ["X-Test-Delay-Ms"] = delay,
                                     ["Idempotency-Key"] = key}, body)
end

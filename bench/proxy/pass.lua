-- wrk: POST requests without an Idempotency-Key (passed through by the proxy).
-- DELAY_MS: how long idem_test_upstream works on each request.
local delay = os.getenv("DELAY_MS") or "0"
local body = '{"amount":10,"currency":"EUR"}'
request = function()
  return wrk.format("POST", "/pay", {["Content-Type"] = "application/json",
                                     ["X-Test-Delay-Ms"] = delay}, body)
end

package admin

import (
	"bytes"
	"fmt"
	"html/template"
	"net/http"
	"time"

	"github.com/solveonce/solveonce/metrics"
)

// statusPage is the human view of /stats and /readyz. It refreshes itself
// every 10 seconds and needs nothing from the network (no scripts, fonts or
// images), so it works inside air-gapped clusters.
var statusPage = template.Must(template.New("status").Funcs(template.FuncMap{
	"money":  func(v float64) string { return fmt.Sprintf("%.2f", v) },
	"pct":    func(v float64) string { return fmt.Sprintf("%.1f%%", v) },
	"ratio":  func(v float64) string { return fmt.Sprintf("%.1f%%", v*100) },
	"uptime": func(s float64) string { return (time.Duration(s) * time.Second).String() },
	"since":  func(t time.Time) string { return t.Format(time.RFC3339) },
}).Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="refresh" content="10">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>solveonce status</title>
<style>
body{font:15px/1.45 system-ui,sans-serif;margin:1.5em auto;max-width:60em;padding:0 1em;color:#1d1d1f}
h1{font-size:1.3em;margin-bottom:.2em} h2{font-size:1.05em;margin:1.4em 0 .4em}
.sub{color:#666;margin-top:0}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(13em,1fr));gap:.8em}
.card{border:1px solid #ddd;border-radius:8px;padding:.7em .9em}
.card b{display:block;font-size:1.9em;font-weight:600}
.card span{color:#666}
table{border-collapse:collapse;width:100%}
th,td{padding:.3em .6em;border-bottom:1px solid #eee;text-align:right}
th:first-child,td:first-child{text-align:left}
.ok{color:#08722b}.degraded{color:#a35f00}.failing{color:#b3001b}
</style></head><body>
<h1>solveonce — {{if .Ready.Ready}}<span class="ok">ready</span>{{else}}<span class="failing">not ready</span>{{end}}</h1>
{{with .S}}
<p class="sub">since {{since .Since}} · up {{uptime .UptimeSeconds}}</p>
<div class="grid">
<div class="card"><b>{{.Deduplicated}}</b><span>of {{.Submissions}} submissions deduplicated ({{pct .SavingsPercent}})</span></div>
<div class="card"><b>{{money .MoneySaved}} {{.Currency}}</b><span>estimated money saved</span></div>
<div class="card"><b>{{.UpstreamCallsAvoided}}</b><span>upstream calls avoided ({{pct .UpstreamCallsAvoidedPercent}} of client requests)</span></div>
<div class="card"><b>{{.PollsAbsorbed}}</b><span>of {{.Polls}} polls answered without CaptchaAI</span></div>
</div>
<h2>By method</h2>
<table><tr><th>method</th><th>submissions</th><th>deduplicated</th><th>sent upstream</th><th>savings</th><th>money saved</th></tr>
{{range .Methods}}<tr><td>{{.Method}}</td><td>{{.Submissions}}</td><td>{{.Deduplicated}}</td><td>{{.SubmitsUpstream}}</td><td>{{pct .SavingsPercent}}</td><td>{{money .MoneySaved}}</td></tr>
{{else}}<tr><td colspan="6">no submissions yet</td></tr>
{{end}}</table>
{{with .Upstream}}
<h2>CaptchaAI</h2>
<table>
<tr><td>circuit breaker</td><td>{{.Breaker}} ({{.Transitions}} transitions)</td></tr>
<tr><td>calls / HTTP attempts / retries</td><td>{{.Calls}} / {{.Attempts}} / {{.Retries}}</td></tr>
<tr><td>rate-limit waits</td><td>{{.RateLimitWaits}}</td></tr>
<tr><td>failed attempts</td><td>{{.Failures}}</td></tr>
</table>
{{end}}
{{with .Cache}}
<h2>Answer cache</h2>
<table><tr><td>entries</td><td>{{.Entries}}</td></tr><tr><td>hit ratio</td><td>{{ratio .HitRatio}}</td></tr></table>
{{end}}
{{end}}
<h2>Readiness</h2>
<table>
{{range .Ready.Checks}}<tr><td>{{.Name}}</td><td class="{{.Status}}">{{.Status}}{{if .Detail}}: {{.Detail}}{{end}}</td></tr>
{{end}}</table>
<p class="sub"><a href="/stats">/stats</a> · <a href="/metrics">/metrics</a> · <a href="/readyz">/readyz</a> · <a href="/healthz">/healthz</a></p>
</body></html>
`))

// serveStatus renders the status page.
func (s *Server) serveStatus(w http.ResponseWriter, r *http.Request) {
	data := struct {
		S     metrics.Summary
		Ready Readiness
	}{Ready: s.Readiness(r.Context())}
	if s.cfg.Summary != nil {
		data.S = s.cfg.Summary()
	}
	var buf bytes.Buffer
	if err := statusPage.Execute(&buf, data); err != nil {
		s.cfg.Log.Error("admin: rendering the status page", "err", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	s.write(w, buf.Bytes())
}

package metrics

import "math"

// Prices say what solves cost, to turn saved submissions into money. The
// zero value prices everything at 0.
type Prices struct {
	// Currency names the unit ("USD"); "" is shown as "USD".
	Currency string
	// Per1000 is the price of 1,000 solves of a family without its own
	// entry in Family.
	Per1000 float64
	// Family maps method families ("image", "userrecaptcha", …) to their
	// price of 1,000 solves.
	Family map[string]float64
}

// PerSolve returns the price of one solve of family fam.
func (p Prices) PerSolve(fam string) float64 {
	if v, ok := p.Family[fam]; ok {
		return v / 1000
	}
	return p.Per1000 / 1000
}

// nanoPerSolve is the price of one solve in billionths of the currency,
// so that sums of counts times prices are exact integers: a counter built
// on them never decreases by a rounding error, which Prometheus would read
// as a reset.
func (p Prices) nanoPerSolve(fam string) int64 {
	return int64(math.Round(p.PerSolve(fam) * 1e9))
}

func (p Prices) currency() string {
	if p.Currency == "" {
		return "USD"
	}
	return p.Currency
}

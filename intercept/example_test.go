package intercept_test

import (
	"context"
	"fmt"
	"sync"

	"github.com/solveonce/solveonce/captchaaitest"
)

// Ten workers submit the same picture at once: CaptchaAI sees one task and
// every worker gets its ID.
func ExampleLayer_Submit() {
	fake, err := captchaaitest.Start("")
	if err != nil {
		panic(err)
	}
	defer fake.Close()
	layer, closeLayer, err := buildLayer(fake.URL)
	if err != nil {
		panic(err)
	}
	defer closeLayer()

	var wg sync.WaitGroup
	ids := make(chan string, 10)
	for range 10 {
		wg.Go(func() {
			s, err := layer.Submit(context.Background(), submitReq([]byte("the same picture")))
			if err != nil {
				panic(err)
			}
			ids <- s.Task()
		})
	}
	wg.Wait()
	close(ids)
	distinct := map[string]bool{}
	for id := range ids {
		distinct[id] = true
	}
	fmt.Println("distinct task IDs:", len(distinct))
	fmt.Println("upstream submissions:", fake.Submits())
	fmt.Println("shared:", layer.Stats.SubmitsShared.Load()+layer.Stats.SubmitsReplayed.Load())
	// Output:
	// distinct task IDs: 1
	// upstream submissions: 1
	// shared: 9
}

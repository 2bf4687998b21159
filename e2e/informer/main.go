// Command informer runs a client-go dynamic informer over accesssessions in one namespace
// and prints one JSON line per event on stdout, plus the full cache state every second, so
// the end-to-end tests can check that a real client-go informer (WatchList on) stays in sync
// with MCP Access through kube-apiserver.
//
// It also prints one REQUEST line per list or watch request the informer sends for
// accesssessions, classified from the wire ("watchlist": a watch with sendInitialEvents=true,
// i.e. a streaming list; "list"; "watch"), with the HTTP status. That is how the tests prove
// which protocol client-go used and how many times it relisted, instead of trusting a flag.
// klog flags (e.g. -v=4) are accepted; klog writes to stderr.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
)

var out = struct {
	sync.Mutex
	enc *json.Encoder
}{enc: json.NewEncoder(os.Stdout)}

func emit(v map[string]any) {
	out.Lock()
	defer out.Unlock()
	_ = out.enc.Encode(v)
}

func describe(obj any) (string, string) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return "", ""
	}
	return u.GetName(), u.GetResourceVersion()
}

// requestReporter reports every list/watch of accesssessions the informer sends.
type requestReporter struct {
	next http.RoundTripper
}

func (r requestReporter) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method != http.MethodGet || !strings.HasSuffix(req.URL.Path, "/accesssessions") {
		return r.next.RoundTrip(req)
	}
	q := req.URL.Query()
	mode := "list"
	if w := q.Get("watch"); w == "1" || w == "true" {
		mode = "watch"
		if q.Get("sendInitialEvents") == "true" {
			mode = "watchlist"
		}
	}
	resp, err := r.next.RoundTrip(req)
	line := map[string]any{"type": "REQUEST", "mode": mode, "resourceVersion": q.Get("resourceVersion")}
	if err != nil {
		line["error"] = err.Error()
	} else {
		line["code"] = resp.StatusCode
	}
	emit(line)
	return resp, err
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the cluster")
	namespace := flag.String("namespace", "", "namespace to watch")
	klog.InitFlags(nil)
	flag.Parse()

	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	cfg.Wrap(func(next http.RoundTripper) http.RoundTripper { return requestReporter{next: next} })
	client, err := dynamic.NewForConfig(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	gvr := schema.GroupVersionResource{Group: "access.mcp-runtime.dev", Version: "v1alpha1", Resource: "accesssessions"}
	factory := dynamicinformer.NewFilteredDynamicSharedInformerFactory(client, 0, *namespace, nil)
	informer := factory.ForResource(gvr).Informer()
	_, err = informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			name, rv := describe(obj)
			emit(map[string]any{"type": "ADDED", "name": name, "rv": rv})
		},
		UpdateFunc: func(_, obj any) {
			name, rv := describe(obj)
			emit(map[string]any{"type": "MODIFIED", "name": name, "rv": rv})
		},
		DeleteFunc: func(obj any) {
			name, rv := describe(obj)
			emit(map[string]any{"type": "DELETED", "name": name, "rv": rv})
		},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	stop := make(chan struct{})
	factory.Start(stop)
	if !cache.WaitForCacheSync(stop, informer.HasSynced) {
		fmt.Fprintln(os.Stderr, "cache did not sync")
		os.Exit(1)
	}
	emit(map[string]any{"type": "SYNCED"})
	for range time.Tick(time.Second) {
		state := map[string]string{}
		for _, obj := range informer.GetStore().List() {
			name, rv := describe(obj)
			state[name] = rv
		}
		names := make([]string, 0, len(state))
		for n := range state {
			names = append(names, n)
		}
		sort.Strings(names)
		emit(map[string]any{"type": "STATE", "items": state, "count": len(names)})
	}
}

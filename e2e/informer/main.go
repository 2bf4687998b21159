// Command informer runs a client-go dynamic informer over accesssessions in one namespace
// and prints one JSON line per event on stdout, plus the full cache state every second, so
// the end-to-end tests can check that a real client-go informer (WatchList on) stays in sync
// with MCP Access through kube-apiserver.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
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

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the cluster")
	namespace := flag.String("namespace", "", "namespace to watch")
	flag.Parse()

	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
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

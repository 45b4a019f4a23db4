(function () {
  "use strict";
  var svg = document.getElementById("timeline");
  var info = document.getElementById("tl-info");
  if (svg) {
    var lit = [];
    var clear = function () {
      for (var i = 0; i < lit.length; i++) { lit[i].classList.remove("hl"); }
      lit = [];
    };
    var light = function (key) {
      clear();
      var all = svg.querySelectorAll("g.bar");
      for (var i = 0; i < all.length; i++) {
        if (all[i].getAttribute("data-k") === key) { all[i].classList.add("hl"); lit.push(all[i]); }
      }
    };
    var barOf = function (node) { return node && node.closest ? node.closest("g.bar") : null; };
    var show = function (bar) {
      var t = bar.querySelector("title");
      if (info && t) { info.textContent = t.textContent; info.hidden = false; }
    };
    svg.addEventListener("mouseover", function (ev) {
      var bar = barOf(ev.target);
      if (bar) { light(bar.getAttribute("data-k")); }
    });
    svg.addEventListener("mouseleave", clear);
    svg.addEventListener("click", function (ev) {
      var bar = barOf(ev.target);
      if (bar) { show(bar); light(bar.getAttribute("data-k")); }
    });
    svg.addEventListener("focusin", function (ev) {
      var bar = barOf(ev.target);
      if (bar) { show(bar); light(bar.getAttribute("data-k")); }
    });
  }
  var opened = [];
  window.addEventListener("beforeprint", function () {
    var ds = document.querySelectorAll("details:not([open])");
    for (var i = 0; i < ds.length; i++) { ds[i].open = true; opened.push(ds[i]); }
  });
  window.addEventListener("afterprint", function () {
    for (var i = 0; i < opened.length; i++) { opened[i].open = false; }
    opened = [];
  });
  document.documentElement.setAttribute("data-js", "1");
})();

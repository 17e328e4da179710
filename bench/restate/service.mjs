// The Restate side of bench/restate/run.sh: the three-step workflow of bench/serve (a = 1, b = a + 1,
// c = b + 1, each written into the instance's data), as a Restate service with two handlers:
// - `steps`: each step is a `ctx.run`, journaled by Restate like an sm4c step;
// - `plain`: the same computation as plain handler code (one journaled invocation, no steps).
import * as restate from "@restatedev/restate-sdk";

const three = restate.service({
  name: "three",
  handlers: {
    steps: async (ctx, input) => {
      const a = await ctx.run("one", () => 1);
      const b = await ctx.run("two", () => a + 1);
      const c = await ctx.run("three", () => b + 1);
      return { ...input, a, b, c };
    },
    plain: async (_ctx, input) => {
      const a = 1;
      const b = a + 1;
      const c = b + 1;
      return { ...input, a, b, c };
    },
  },
});

const port = Number(process.env.PORT ?? 9080);
await restate.serve({ services: [three], port });
